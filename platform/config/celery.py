"""The Celery app. Settings come from Django's (CELERY_* names)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_PLATFORM_DIR = str(Path(__file__).resolve().parent.parent)
if _PLATFORM_DIR not in sys.path:
    sys.path.insert(0, _PLATFORM_DIR)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from celery import Celery  # noqa: E402

app = Celery("platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

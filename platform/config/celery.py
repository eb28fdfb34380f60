"""The Celery app. Settings come from Django's (CELERY_* names)."""

from __future__ import annotations

import logging
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


class QuietPeriodicSweep(logging.Filter):
    """Drops Celery's routine INFO lines about the periodic ``launcher.sweep`` (sent / received /
    succeeded, three lines every ``LAUNCHER_SWEEP_INTERVAL_S``), which would bury everything else in a
    worker's log. Warnings and errors about it, and the sweep's own report when it acted, still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or "launcher.sweep" not in record.getMessage()


# The loggers Celery writes those lines with: beat's "Sending due task", the worker's "received" and
# the tracer's "succeeded".
for _name in ("celery.beat", "celery.worker.strategy", "celery.app.trace"):
    logging.getLogger(_name).addFilter(QuietPeriodicSweep())

"""Django project configuration. Importing this package loads the Celery app (Celery convention)."""

from config.celery import app as celery_app

__all__ = ["celery_app"]

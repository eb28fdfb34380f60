"""Platform-wide bookkeeping: which Celery workers are alive."""

from __future__ import annotations

from django.db import models


class WorkerPing(models.Model):
    """One answered ping: proof that a Celery worker consumed a task from the broker and reached the DB."""

    token = models.CharField(max_length=64, unique=True)
    hostname = models.CharField(max_length=255)
    broker = models.CharField(max_length=32)
    sent_at = models.DateTimeField()
    answered_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-answered_at"]

    def __str__(self) -> str:
        return f"{self.hostname} via {self.broker} at {self.answered_at:%Y-%m-%d %H:%M:%S}"

"""Launcher bookkeeping: who supervises a run right now (a lease), and how far its log was read.

The lease is what makes re-attach work: a supervising task renews it every poll; when a Celery worker
dies (``kill -9``), the lease runs out and the periodic sweep hands the run to another worker, which
finds the job again by ``Run.ray_job_id`` instead of starting it twice.
"""

from __future__ import annotations

from django.db import models


class Supervision(models.Model):
    run = models.OneToOneField(
        "experiments.Run", on_delete=models.CASCADE, primary_key=True, related_name="supervision"
    )
    # "" = reserved for whichever task picks it up next; otherwise "<hostname>:<pid>:<nonce>".
    owner = models.CharField(max_length=200, blank=True, default="")
    lease_until = models.DateTimeField()
    log_offset = models.BigIntegerField(
        default=0, help_text="Characters of the job log already turned into events."
    )
    attaches = models.PositiveIntegerField(default=0, help_text="How many times a supervisor took this run.")
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"run {self.run_id} by {self.owner or '(unowned)'} until {self.lease_until:%H:%M:%S}"


class LauncherLock(models.Model):
    """A named row locked (SELECT ... FOR UPDATE) to serialise admission of queued runs.

    On SQLite the settings open every transaction IMMEDIATE, which serialises writers the same way."""

    name = models.CharField(max_length=50, primary_key=True)

    def __str__(self) -> str:
        return self.name


class ExportState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Export(models.Model):
    """One request to export a checkpoint, written by the platform only (launcher.exports).

    What the export job reads (the :class:`tracking.models.Checkpoint` row) and where it writes (``out``,
    computed from the run's own folder) are fixed when the request is made; nothing a run or a member
    reports afterwards changes them. Run events about an export are a notice for the live page, never
    read back."""

    run = models.ForeignKey("experiments.Run", on_delete=models.CASCADE, related_name="exports")
    checkpoint = models.ForeignKey("tracking.Checkpoint", on_delete=models.CASCADE, related_name="exports")
    step = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=ExportState.choices, default=ExportState.QUEUED)
    out = models.CharField(max_length=1000, help_text="The model directory the job writes (platform-chosen).")
    job_id = models.CharField(max_length=200, blank=True, default="")
    error = models.TextField(blank=True, default="")
    size_bytes = models.BigIntegerField(null=True, blank=True)
    dtype = models.CharField(max_length=32, blank=True, default="")
    requested_by = models.CharField(max_length=150, blank=True, default="")
    requested_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["run_id", "step", "id"]
        constraints = [
            # At most one export of a checkpoint in flight: a second request returns the first.
            models.UniqueConstraint(
                fields=["run", "step"],
                condition=models.Q(state__in=["queued", "running"]),
                name="uniq_active_export",
            )
        ]

    def __str__(self) -> str:
        return f"export #{self.pk} of run {self.run_id} step {self.step}: {self.state}"

"""What runs produce: metric points, events (logs, status changes, alerts), checkpoints, samples."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from rl_engine.wire import EventKind


class MetricPoint(models.Model):
    """One scalar. Unique on (run, key, step): ingestion is idempotent and the first value stored wins."""

    # No database FK constraint and no separate run index: the unique (run, key, step) index already
    # starts with run, and the per-row FK trigger halved ingestion speed. Integrity holds in the app:
    # points are written only for a run checked to exist, runs are deleted only when no longer active
    # (their ingest tokens revoked), and Django's CASCADE still deletes a run's points.
    run = models.ForeignKey(
        "experiments.Run",
        on_delete=models.CASCADE,
        related_name="metric_points",
        db_constraint=False,
        db_index=False,
    )
    key = models.CharField(max_length=200)
    step = models.BigIntegerField()
    value = models.FloatField()
    wall_time = models.FloatField(help_text="Unix seconds when the engine measured it.")

    class Meta:
        # The unique constraint's index on (run, key, step) serves every metric query (keys, step range).
        constraints = [models.UniqueConstraint(fields=["run", "key", "step"], name="uniq_metric_point")]

    def __str__(self) -> str:
        return f"{self.key}@{self.step}={self.value}"


class RunEvent(models.Model):
    """An ordered record of a run: ``seq`` is 1, 2, ... per run without gaps between committed events."""

    run = models.ForeignKey("experiments.Run", on_delete=models.CASCADE, related_name="events")
    seq = models.BigIntegerField()
    # The kinds the ingestion wire format defines (rl_engine.wire.EventKind: the one declaration).
    kind = models.CharField(max_length=16, choices=[(k.value, k.name.title()) for k in EventKind])
    message = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    # The id its sender gave the batch it came in (the engine's sink does): a re-sent batch is found by
    # it and answered with these rows instead of being stored twice. "" for events without one.
    batch_id = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["run_id", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="uniq_event_seq")]
        indexes = [models.Index(fields=["run", "batch_id"], name="event_batch", condition=~Q(batch_id=""))]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind}: {self.message[:60]}"


class Checkpoint(models.Model):
    run = models.ForeignKey("experiments.Run", on_delete=models.CASCADE, related_name="checkpoints")
    step = models.BigIntegerField()
    path = models.CharField(max_length=1000)
    size_bytes = models.BigIntegerField(default=0)
    created = models.DateTimeField(auto_now_add=True)
    # When the engine reported it removed (``trainer.keep_checkpoints``): listed, but nothing to export,
    # resume or fork from.
    pruned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run_id", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="uniq_checkpoint_step")]

    def __str__(self) -> str:
        return f"{self.run_id}@{self.step}: {self.path}"


class Sample(models.Model):
    """An example (prompt, response, reward) for the sample browser; at most SAMPLES_PER_STEP per step."""

    run = models.ForeignKey("experiments.Run", on_delete=models.CASCADE, related_name="samples")
    step = models.BigIntegerField()
    prompt = models.TextField()
    response = models.TextField()
    answer = models.TextField(blank=True, default="", help_text="The expected answer, when the task has one.")
    reward = models.FloatField(null=True, blank=True)
    version_start = models.IntegerField(
        null=True, blank=True, help_text="Policy version generation began on."
    )
    version_end = models.IntegerField(null=True, blank=True, help_text="Policy version generation ended on.")
    reward_parts = models.JSONField(
        null=True,
        blank=True,
        help_text="Each reward component's score by label (wire.SampleIn.reward_parts: at most 32, finite).",
    )
    turns = models.JSONField(
        null=True,
        blank=True,
        help_text="A multi-turn episode's turns in order (wire.SampleIn.turns: role, text, tokens, logprob_mean).",
    )
    created = models.DateTimeField(auto_now_add=True)
    batch_id = models.CharField(max_length=64, blank=True, default="")  # as RunEvent.batch_id

    class Meta:
        ordering = ["run_id", "step", "id"]
        indexes = [
            models.Index(fields=["run", "step"], name="sample_run_step"),
            models.Index(fields=["run", "batch_id"], name="sample_batch", condition=~Q(batch_id="")),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}@{self.step}: {self.prompt[:40]}"


# Bucket widths (in steps) of the rollups kept on PostgreSQL: a chart of any range reads at most ~16 rollup
# rows per output bucket instead of every point (see tracking.selectors).
ROLLUP_WIDTHS: tuple[int, ...] = (16, 256, 4096, 65536, 1048576)


class MetricRollup(models.Model):
    """Min and max point (and count) of one key over steps [bucket*width, (bucket+1)*width).

    Maintained on PostgreSQL in the same statement that inserts points, from the points actually
    inserted (so retries and "first value wins" hold here too). Unused on SQLite, where queries scan.
    """

    run = models.ForeignKey(
        "experiments.Run", on_delete=models.CASCADE, related_name="+", db_constraint=False, db_index=False
    )  # as MetricPoint.run
    key = models.CharField(max_length=200)
    width = models.IntegerField()
    bucket = models.BigIntegerField()
    count = models.IntegerField()
    min_value = models.FloatField()
    min_step = models.BigIntegerField()
    min_wall_time = models.FloatField()
    max_value = models.FloatField()
    max_step = models.BigIntegerField()
    max_wall_time = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key", "width", "bucket"], name="uniq_metric_rollup")
        ]

    def __str__(self) -> str:
        return f"{self.key}[{self.bucket * self.width}, +{self.width})"


class RunProgress(models.Model):
    """When the run's engine last made progress: stored a new step's metrics, or reported a status or a
    checkpoint. The launcher fails a running run whose engine made none for RUN_STALL_TIMEOUT_S (a
    deadlocked engine would otherwise hold its concurrency slot forever: its sink keeps heartbeating)."""

    run = models.OneToOneField(
        "experiments.Run", on_delete=models.CASCADE, primary_key=True, related_name="progress"
    )
    step = models.BigIntegerField(null=True, blank=True, help_text="Highest step with stored metrics.")
    at = models.DateTimeField()
    # The run's metric batches, numbered: each ingest adds its points here, under a per-run lock and in
    # the same transaction as its rows (tracking/coverage.py: what live followers compare against).
    points = models.BigIntegerField(db_default=0, help_text="Metric points stored since counting began.")
    last_point_id = models.BigIntegerField(null=True, blank=True, help_text="Id of the last stored point.")

    def __str__(self) -> str:
        return f"run {self.run_id}: step {self.step} at {self.at:%H:%M:%S}"

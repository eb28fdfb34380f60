"""Experiments (a named, validated engine config) and their runs (one launch each).

A run's state changes only through :func:`experiments.services.run_transition` (compare-and-set);
never assign ``run.state`` and ``save()``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Experiment(models.Model):
    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="experiments")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    tags = models.JSONField(default=list, blank=True, help_text="A list of short strings.")
    # Validated by rl_engine.config.parse_config and stored normalised (every default made explicit).
    config = models.JSONField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Last run number handed out; bumped with an F() update so concurrent launches get distinct numbers.
    run_counter = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["project", "-created_at"], name="exp_project_created")]

    def __str__(self) -> str:
        return self.name


class RunState(models.TextChoices):
    """The one list of run states, in lifecycle order (the pages get them from their JSON: summary.py)."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_STATES: frozenset[str] = frozenset(
    s.value for s in (RunState.QUEUED, RunState.STARTING, RunState.RUNNING, RunState.CANCELLING)
)
TERMINAL_STATES: frozenset[str] = frozenset(RunState.values) - ACTIVE_STATES
# What a cancel request moves on (a cancelling run is on its way already).
CANCELLABLE_STATES: frozenset[str] = ACTIVE_STATES - {RunState.CANCELLING.value}


class Provider(models.TextChoices):
    LOCAL = "local", "Local Ray head"
    ADDRESS = "address", "Existing Ray cluster"


class Run(models.Model):
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    # Denormalised from the experiment: every permission check and list filter goes through the project.
    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="runs")
    number = models.PositiveIntegerField(help_text="1, 2, ... within the experiment.")
    config = models.JSONField(help_text="The experiment config frozen at launch (normalised).")
    # rl_engine.jobspec.InputPaths as the policy resolved them when the run was created
    # (experiments.config_policy.resolved_inputs); null on rows from before it was stored.
    inputs = models.JSONField(
        null=True, blank=True, help_text="Where the job reads the config's model and data paths."
    )
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.QUEUED)
    priority = models.IntegerField(default=0, help_text="Higher starts first.")
    provider = models.CharField(max_length=16, choices=Provider.choices, default=Provider.LOCAL)
    cluster_address = models.CharField(max_length=300, blank=True, default="")
    ray_job_id = models.CharField(max_length=200, blank=True, default="", help_text="Ray Jobs submission id.")
    celery_task_id = models.CharField(max_length=200, blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # What the engine says a graceful stop needs (rl_engine.pipeline.stop_grace), seconds; null: not said.
    stop_grace_s = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    resumed_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="resumed_by"
    )
    resumed_from_checkpoint = models.ForeignKey(
        "tracking.Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Last RunEvent.seq handed out (see tracking.services.events_append).
    event_seq = models.BigIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["experiment", "number"], name="uniq_run_number")]
        indexes = [
            models.Index(fields=["state", "-priority", "created_at"], name="run_queue_order"),
            models.Index(fields=["project", "-created_at"], name="run_project_created"),
        ]

    def __str__(self) -> str:
        return f"{self.experiment.name} #{self.number}"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

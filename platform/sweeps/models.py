"""Sweeps: a grid or random search over config fields, launched as one object.

A sweep's runs are ordinary runs of its base experiment (each with the base config, the point's
overrides and its own seed), created queued at once; the launcher's admission starts at most
``max_concurrent`` of them at a time (launcher.services.runs_admit). :class:`SweepRun` records what
the sweep made of each run: its index, the point, the seed, and whether the median rule stopped it.
A sweep's state is derived from its runs' (sweeps.selectors.sweep_state), never stored.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Method(models.TextChoices):
    GRID = "grid", "Grid"
    RANDOM = "random", "Random"


class Goal(models.TextChoices):
    MAX = "max", "Maximise"
    MIN = "min", "Minimise"


class Summary(models.TextChoices):
    LAST = "last", "Last value"
    BEST = "best", "Best value"


class Sweep(models.Model):
    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="sweeps")
    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.CASCADE, related_name="sweeps")
    name = models.CharField(max_length=200)
    method = models.CharField(max_length=8, choices=Method.choices)
    # As given (dotted path -> spec; sweeps.search_space). Points are drawn in sorted path order.
    search_space = models.JSONField()
    max_runs = models.PositiveIntegerField()
    max_concurrent = models.PositiveIntegerField()
    metric = models.CharField(max_length=200)
    goal = models.CharField(max_length=3, choices=Goal.choices, default=Goal.MAX)
    summary = models.CharField(max_length=4, choices=Summary.choices, default=Summary.LAST)
    # The median rule: None (off) or {"min_steps": N, "min_runs": M} (sweeps.early_stopping).
    early_stopping = models.JSONField(null=True, blank=True)
    seed = models.BigIntegerField(help_text="Random points come from it; run i gets seed + i.")
    priority = models.IntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["project", "-created_at"], name="sweep_project_created")]

    def __str__(self) -> str:
        return self.name


class SweepRun(models.Model):
    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="members")
    run = models.OneToOneField("experiments.Run", on_delete=models.CASCADE, related_name="sweep_member")
    index = models.PositiveIntegerField(help_text="0, 1, ... in the order the points were drawn.")
    params = models.JSONField(help_text="The point: dotted config path -> value.")
    seed = models.BigIntegerField(help_text="The run's config seed.")
    early_stopped_at = models.DateTimeField(null=True, blank=True)
    early_stop_reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["sweep", "index"]
        constraints = [models.UniqueConstraint(fields=["sweep", "index"], name="uniq_sweep_index")]

    def __str__(self) -> str:
        return f"{self.sweep} #{self.index}"

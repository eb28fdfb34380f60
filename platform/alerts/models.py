"""Alerts the platform raises about runs, the per-project metric rules that raise some of them, and the
project webhooks that carry them out (with a log of every delivery).

An alert is the platform's record, never a run's claim: the platform decides that a stored engine alert
event, a run's transition to ``failed`` or a rule's condition is an alert; what the engine wrote is at
most the (bounded) message. One alert stays open per (run, ``key``): a repeat bumps ``last_seen`` and
``count`` instead of adding a row.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class AlertKind(models.TextChoices):
    ENGINE = "engine", "Engine alert"  # an ``alert`` event the engine sent (its watchdog, a sink)
    RUN_FAILED = "run_failed", "Run failed"  # the run's transition to ``failed``
    RULE = "rule", "Metric rule"  # a project's MetricRule found true by the evaluation task


class Alert(models.Model):
    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="alerts")
    run = models.ForeignKey("experiments.Run", on_delete=models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=16, choices=AlertKind.choices)
    rule = models.ForeignKey(
        "alerts.MetricRule", null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts"
    )
    # What makes two alerts "the same": the kind, plus the rule for a rule's alert ("rule:<id>").
    key = models.CharField(max_length=64)
    message = models.TextField()
    # Platform-computed facts (a rule's metric, best value and step); never copied from a run's report.
    detail = models.JSONField(default=dict, blank=True)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    count = models.PositiveIntegerField(default=1)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-last_seen", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "key"], condition=Q(resolved_at__isnull=True), name="alert_one_open_per_key"
            )
        ]
        indexes = [
            models.Index(fields=["project", "-last_seen"], name="alert_project_recent"),
            models.Index(fields=["run", "key", "-id"], name="alert_run_key"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} on run {self.run_id}: {self.message[:60]}"


class RuleKind(models.TextChoices):
    # The metric's best value has not improved (strictly) for ``steps`` steps of that metric.
    NO_IMPROVEMENT = "no_improvement", "No improvement"
    # The metric has no stored point for the last ``steps`` steps while the run stores others: what a
    # NaN/inf loss looks like here (the engine's sink drops non-finite values, the ingestion refuses them).
    MISSING = "missing", "Missing (non-finite or not reported)"


class Goal(models.TextChoices):
    MAX = "max", "Maximise"
    MIN = "min", "Minimise"


class MetricRule(models.Model):
    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="metric_rules")
    metric = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=RuleKind.choices)
    goal = models.CharField(max_length=3, choices=Goal.choices, default=Goal.MAX)
    steps = models.PositiveIntegerField()
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.metric} {self.kind} {self.steps} ({self.project})"


class RuleState(models.Model):
    """What the evaluation task has read of one run's metric for one rule, so that each pass reads only
    the points stored since (``checked_step``): the best value and the step that first reached it."""

    rule = models.ForeignKey(MetricRule, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey("experiments.Run", on_delete=models.CASCADE, related_name="+")
    checked_step = models.BigIntegerField(default=-1)
    best_value = models.FloatField(null=True, blank=True)
    best_step = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["rule", "run"], name="rule_state_once")]


class Webhook(models.Model):
    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="webhooks")
    url = models.CharField(max_length=2000)
    secret = models.CharField(max_length=200)  # the HMAC key; shown once, when the webhook is created
    active = models.BooleanField(default=True)
    # Alert kinds this webhook receives ([]: every kind).
    events = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.url} ({self.project})"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    RETRYING = "retrying", "Retrying"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"  # every attempt failed, or the webhook was deactivated meanwhile
    REFUSED = "refused", "Refused"  # the URL is not allowed (docs/api.md, "Webhooks"): never retried


class WebhookDelivery(models.Model):
    """One alert for one webhook: the payload is frozen at creation (every attempt sends the same body,
    with ``delivery_id`` as the receiver's idempotency key).

    ``next_attempt_at`` is when a ``pending`` or ``retrying`` delivery is due: an attempt is claimed
    only once it is due and only as the attempt after ``attempts`` (alerts/delivery.py), so the
    countdown task and the beat sweep that stands in for a lost one never send the same attempt twice.
    """

    delivery_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    status_code = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)  # an attempt in flight holds it until then
    next_attempt_at = models.DateTimeField(null=True, blank=True)  # pending/retrying: due from then on
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-pk"]
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="delivery_due")]

    def __str__(self) -> str:
        return f"{self.delivery_id} → {self.webhook.url}: {self.status}"

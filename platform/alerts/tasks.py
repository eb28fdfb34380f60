"""Celery tasks of the alerts app (they take ids, are idempotent and acknowledged late)."""

from __future__ import annotations

from celery import shared_task

from alerts import rules
from alerts.delivery import deliver_webhook

__all__ = ["deliver_webhook", "evaluate_rules"]


@shared_task(name="alerts.evaluate_rules", acks_late=True)
def evaluate_rules() -> int:
    """The metric rules over the running runs (beat: every ALERT_RULES_INTERVAL_S)."""
    return rules.rules_evaluate()

"""Celery tasks of the alerts app (they take ids, are idempotent and acknowledged late)."""

from __future__ import annotations

from celery import shared_task

from alerts import rules
from alerts.delivery import deliver_webhook, resend_due

__all__ = ["deliver_webhook", "evaluate_rules", "resend_due_deliveries"]


@shared_task(name="alerts.evaluate_rules", acks_late=True)
def evaluate_rules() -> int | None:
    """The metric rules over the running runs (beat: every ALERT_RULES_INTERVAL_S); None: skipped, a
    pass was still running."""
    return rules.rules_evaluate()


@shared_task(name="alerts.resend_due_deliveries", acks_late=True)
def resend_due_deliveries() -> int:
    """Webhook attempts whose countdown task was lost (beat: every WEBHOOK_SWEEP_INTERVAL_S)."""
    swept = resend_due()
    return len(swept.resent) + len(swept.failed)

"""Celery tasks of the sweeps app (they take ids, are idempotent and acknowledged late)."""

from __future__ import annotations

from celery import shared_task

from sweeps.early_stopping import sweeps_early_stop


@shared_task(name="sweeps.early_stop", acks_late=True)
def early_stop() -> list[int]:
    """The median rule over the sweeps' running runs (beat: every SWEEP_EARLY_STOP_INTERVAL_S)."""
    return sweeps_early_stop()

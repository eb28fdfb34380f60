"""Liveness recorded as the work happens: each completed run of the periodic ``launcher.sweep`` (sent by
beat, consumed by a worker, which then reached the database) is recorded by the worker that ran it, so
``/api/health/`` knows the worker and beat are alive without anyone sending a ping."""

from __future__ import annotations

from typing import Any

from celery.signals import task_success

SWEEP_TASK = "launcher.sweep"


@task_success.connect
def _record_sweep(sender: Any = None, **_: Any) -> None:
    if getattr(sender, "name", None) == SWEEP_TASK:
        from core.services import sweep_ran

        sweep_ran()

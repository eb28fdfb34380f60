"""Celery tasks of the launcher. They take ids, are idempotent and acknowledged late; the rules live in
``services.py`` (admission, launch) and ``supervisor.py`` (follow, cancel, sweep)."""

from __future__ import annotations

import logging

from celery import shared_task

from experiments.models import Run, RunState
from launcher import services, supervisor

log = logging.getLogger(__name__)


def _start_admitted(admitted: list[int], skip: int | None = None) -> None:
    for run_id in admitted:
        if run_id != skip:
            start_run.delay(run_id)


@shared_task(name="launcher.start_run", acks_late=True)
def start_run(run_id: int) -> str:
    """Admit queued runs in priority order; launch this one if it is (now) ``starting``; then hand it
    to ``supervise_run``. A run over the concurrency limit stays ``queued`` until a slot frees."""
    _start_admitted(services.runs_admit(), skip=run_id)
    state = Run.objects.filter(pk=run_id).values_list("state", flat=True).first()
    if state is None:
        return "no such run"
    if state == RunState.STARTING:
        owner = services.owner_id()
        if not services.lease_acquire(run_id=run_id, owner=owner, seconds=services.LAUNCH_LEASE_S):
            return "being launched elsewhere"
        try:
            state = services.run_launch(run_id=run_id, owner=owner)
        finally:
            services.lease_release(run_id=run_id, owner=owner, reserve_s=supervisor.RESERVE_S)
        if state in (RunState.RUNNING, RunState.CANCELLING):
            supervise_run.delay(run_id)
        else:
            schedule_runs.delay()  # the launch failed: its slot is free again
    return state


@shared_task(name="launcher.supervise_run", acks_late=True)
def supervise_run(run_id: int) -> str:
    """Follow the run's job to its end (re-attaches by the stored job id after a worker death)."""
    outcome = supervisor.supervise(run_id=run_id, owner=services.owner_id())
    if outcome in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED):
        _start_admitted(services.runs_admit())
    return outcome


@shared_task(name="launcher.cancel_run", acks_late=True)
def cancel_run(run_id: int) -> str:
    """Stop the run's job gracefully, hard after the grace period; the run ends ``cancelled``."""
    state = supervisor.cancel(run_id=run_id)
    _start_admitted(services.runs_admit())
    return state


@shared_task(name="launcher.schedule_runs", acks_late=True)
def schedule_runs() -> list[int]:
    """Start queued runs that fit the concurrency limits (on run end, and from the sweep)."""
    admitted = services.runs_admit()
    _start_admitted(admitted)
    return admitted


@shared_task(name="launcher.sweep", acks_late=True)
def sweep() -> dict[str, list[int]]:
    """Periodic: reap silent runs, re-attach orphaned ones (their worker died), start queued ones."""
    result = supervisor.sweep()
    for run_id in result.to_start:
        start_run.delay(run_id)
    for run_id in result.to_supervise:
        supervise_run.delay(run_id)
    admitted = services.runs_admit()
    _start_admitted(admitted)
    if result.reaped or result.to_start or result.to_supervise:
        log.info(
            "sweep: reaped %s, relaunch %s, re-attach %s", result.reaped, result.to_start, result.to_supervise
        )
    return {
        "reaped": result.reaped,
        "relaunched": result.to_start,
        "reattached": result.to_supervise,
        "admitted": admitted,
    }


from launcher.exports import export_checkpoint  # noqa: E402, F401 - registers launcher.export_checkpoint

"""What a run's lifecycle announces to the apps above experiments.

``experiments`` owns the run state machine but imports neither ``tracking`` nor ``launcher``: the
dependency goes one way (accounts < experiments < tracking < launcher, checked by
tests/foundation/test_import_boundary.py). Those apps connect receivers when they are ready:

- ``tracking`` records every :class:`StateChanged` as the run's ``status`` event;
- ``launcher`` enqueues its start task for every :class:`RunQueued` and its cancel task for every
  :class:`CancelRequested`, once the transaction commits.

Each message is sent inside the transaction that made the change, so a receiver's own writes (the status
event) commit or roll back with it; what must wait for the commit (a Celery task, which would not find
an uncommitted run) registers ``transaction.on_commit`` itself. A receiver's error propagates to the
sender, as a direct call's would.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.dispatch import Signal


@dataclass(frozen=True)
class StateChanged:
    """A run entered ``to_state`` (from ``from_state``; None: the run was just created)."""

    run_id: int
    from_state: str | None
    to_state: str
    message: str  # one line for the run's event log, e.g. "running → failed: driver died"
    error: str = ""


@dataclass(frozen=True)
class RunQueued:
    """A new run waits for the launcher (after a launch or a resume)."""

    run_id: int


@dataclass(frozen=True)
class CancelRequested:
    """A user asked to stop a started run; it is ``cancelling`` until the launcher has stopped its job."""

    run_id: int


# Each is sent as ``signal.send(sender=<message class>, message=<message>)``.
state_changed = Signal()
run_queued = Signal()
cancel_requested = Signal()

_SIGNALS: dict[type, Signal] = {
    StateChanged: state_changed,
    RunQueued: run_queued,
    CancelRequested: cancel_requested,
}


def announce(message: StateChanged | RunQueued | CancelRequested) -> None:
    """Send ``message`` to the receivers of its signal."""
    _SIGNALS[type(message)].send(sender=type(message), message=message)

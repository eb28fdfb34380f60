"""The tracking app's part in a run's lifecycle (experiments.lifecycle): every state change is the run's
``status`` event, in the same transaction as the change (connected in TrackingConfig.ready)."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from experiments.lifecycle import StateChanged, state_changed
from rl_engine.wire import EventKind
from tracking.services import events_append


@receiver(state_changed, dispatch_uid="tracking.status_event")
def record_status_event(sender: type, message: StateChanged, **kwargs: Any) -> None:
    # ``from`` and ``to`` are reserved for these events: the dashboard's state badge follows them.
    data: dict[str, Any] = {"from": message.from_state, "to": message.to_state}
    if message.error:
        data["error"] = message.error
    events_append(run_id=message.run_id, kind=EventKind.STATUS, message=message.message, data=data)

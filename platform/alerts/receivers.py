"""The alerts app's part in a run's lifecycle and its ingestion (connected in AlertsConfig.ready): the
platform decides what is an alert. A run that enters ``failed`` (the platform's own transition) opens a
``run_failed`` alert; an ``alert`` event the engine sent, once stored, opens (or repeats) the run's
``engine`` alert, the event's text being only its bounded message."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from alerts.models import AlertKind
from alerts.services import alert_raise
from experiments.lifecycle import StateChanged, state_changed
from experiments.models import RunState
from tracking.announcements import EngineAlertStored, engine_alert_stored


@receiver(state_changed, dispatch_uid="alerts.run_failed")
def run_failed_alert(sender: type, message: StateChanged, **kwargs: Any) -> None:
    if message.to_state == RunState.FAILED:
        alert_raise(
            run_id=message.run_id, kind=AlertKind.RUN_FAILED, message=message.error or message.message
        )


@receiver(engine_alert_stored, dispatch_uid="alerts.engine_alert")
def engine_alert(sender: type, message: EngineAlertStored, **kwargs: Any) -> None:
    alert_raise(
        run_id=message.run_id,
        kind=AlertKind.ENGINE,
        message=message.message or "the engine reported an alert",
        detail={"event_seq": message.seq},
    )

"""What the tracking app announces to the apps above it (as ``experiments.lifecycle`` does for a run's
state): an ``alert`` event the engine sent has been stored. ``alerts`` connects a receiver that decides
whether that is an alert of the platform's (it is, with the event's text as its bounded message).

Sent inside the transaction that stored the event, so the receiver's writes commit or roll back with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.dispatch import Signal


@dataclass(frozen=True)
class EngineAlertStored:
    """The engine of ``run_id`` reported an ``alert`` event, stored as event ``seq``."""

    run_id: int
    seq: int
    message: str


engine_alert_stored = Signal()


def announce(message: EngineAlertStored) -> None:
    engine_alert_stored.send(sender=EngineAlertStored, message=message)

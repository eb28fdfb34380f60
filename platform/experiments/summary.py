"""The run summary the dashboard starts from: embedded in the run page and sent again in the live
stream's ``hello`` message (so a reconnecting page sees the current state)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from experiments.models import ACTIVE_STATES, TERMINAL_STATES, Run


def _iso(d: datetime | None) -> str | None:
    return d.isoformat() if d else None


def run_summary(run: Run) -> dict[str, Any]:
    """JSON-ready facts about ``run`` (load it with ``select_related("experiment", "project")``)."""
    return {
        "id": run.pk,
        "number": run.number,
        "state": run.state,
        "error": run.error,
        "experiment": {"id": run.experiment_id, "name": run.experiment.name},
        "project": {"id": run.project_id, "name": run.project.name},
        "created_at": _iso(run.created_at),
        "queued_at": _iso(run.queued_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "heartbeat_at": _iso(run.heartbeat_at),
        "resumed_from": run.resumed_from_id,
        "last_seq": run.event_seq,
        "total_steps": (run.config.get("trainer") or {}).get("total_steps"),
        "terminal_states": sorted(TERMINAL_STATES),
        "active_states": sorted(ACTIVE_STATES),
    }

"""The run summary the dashboard starts from: embedded in the run page and sent again in the live
stream's ``hello`` message (so a reconnecting page sees the current state)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from experiments.models import ACTIVE_STATES, CANCELLABLE_STATES, TERMINAL_STATES, Run, RunState


def _iso(d: datetime | None) -> str | None:
    return d.isoformat() if d else None


def _ordered(states: frozenset[str]) -> list[str]:
    return [s for s in RunState.values if s in states]


def run_states() -> dict[str, list[str]]:
    """The run states a page's script needs, by role, each in lifecycle order (RunState's)."""
    return {
        "active_states": _ordered(ACTIVE_STATES),
        "terminal_states": _ordered(TERMINAL_STATES),
        "cancellable_states": _ordered(CANCELLABLE_STATES),
        "successful_states": [RunState.SUCCEEDED.value],
    }


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
        "model": model_label(run.config),
        **run_states(),
    }


def model_label(config: dict[str, Any]) -> str:
    """What a run trains, for its page: the model folder's name, and its LoRA adapters when ``model.lora``
    is set ("smollm2-135m-instruct · LoRA r=16, alpha=32"); read from the stored config as it is."""
    model = config.get("model") or {}
    path = str(model.get("path") or "")
    label = path.rstrip("/").rsplit("/", 1)[-1] or path
    lora = model.get("lora")
    if isinstance(lora, dict):
        label += f" · LoRA r={lora.get('rank', 16)}, alpha={lora.get('alpha', 32.0):g}"
    return label

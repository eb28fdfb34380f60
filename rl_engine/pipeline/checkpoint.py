"""Checkpoint bookkeeping: names, pruning, and the pipeline part of the checkpoint (``extra``).

The trainer writes model/optimizer/RNG/step atomically (``save_checkpoint(path, extra)``); the
pipeline adds, JSON-serialisable, everything needed for a lossless resume: queued groups, each
rollouter's unfinished (interrupted) groups and admitted-but-unstarted prompts, each rollouter's
prompt-stream position, and the queue's counters (so conservation holds across the restart).

The actors exchange typed messages (``QueueSnapshot``, ``PauseState``); this module is the one place
that turns them into the on-disk dicts and back (format 1, unchanged since the pipeline's first
checkpoints; rollouter states written before parking kept one unit per thread have a single
``parked_prompts`` list instead of ``parked``)::

    {"pipeline": {"format": 1, "step": int,
                  "queue": {"groups": [[sample]], "counters": {"admitted", "generated", "consumed",
                                                               "dropped_stale"}},
                  "rollouters": [{"pending": [[sample]], "parked": [[prompt]], "prompts": {...},
                                  "in_flight": int, "sampler": str}]}}

where a sample / prompt is the ``dataclasses.asdict`` of a ``Sample`` / ``Prompt`` and ``sampler`` the
rollout worker's sampling random numbers (``RolloutWorker.sampler_state``), base64: absent for a
worker whose engine keeps them, and from checkpoints written before they were saved.
"""

from __future__ import annotations

import base64
import re
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rl_engine.types import PauseState, Prompt, QueueCounters, QueueSnapshot, Sample

FORMAT = 1
_NAME = re.compile(r"^step_(\d{8})$")


def checkpoint_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}"


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    return sorted(found)


def prune(directory: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; returns what was removed."""
    removed = []
    for _, p in list_checkpoints(directory)[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# Sample fields of multi-turn episodes (rl_engine.envs), written only when set: a single-turn run's
# checkpoint keeps the format it had before they existed.
_EPISODE_FIELDS = {"loss_mask": None, "turn_start": 0}


def sample_to_dict(s: Sample) -> dict[str, Any]:
    d = asdict(s)
    for key, unset in _EPISODE_FIELDS.items():
        if d[key] == unset:
            del d[key]
    return d


def sample_from_dict(d: dict[str, Any]) -> Sample:
    return Sample(**d)


def pipeline_extra(step: int, queue: QueueSnapshot, rollouters: list[PauseState]) -> dict[str, Any]:
    """The pipeline part of a checkpoint's ``extra``, in the on-disk format (module docstring)."""
    return {
        "pipeline": {
            "format": FORMAT,
            "step": step,
            "queue": {
                "groups": [[sample_to_dict(s) for s in g] for g in queue.groups],
                "counters": asdict(queue.counters),
            },
            "rollouters": [_rollouter_to_dict(r) for r in rollouters],
        }
    }


def restore_parts(extra: dict[str, Any], num_rollouters: int) -> tuple[QueueSnapshot, list[PauseState]]:
    """Split a checkpoint's ``extra`` into the queue state and per-rollouter states (validated)."""
    p = extra.get("pipeline")
    if not p or p.get("format") != FORMAT:
        raise ValueError(f"the checkpoint has no pipeline state (format {FORMAT} expected)")
    if len(p["rollouters"]) != num_rollouters:
        raise ValueError(
            f"the checkpoint was written with {len(p['rollouters'])} rollouters; "
            f"set pipeline.num_rollouters={len(p['rollouters'])} to resume it"
        )
    queue = QueueSnapshot(
        groups=[[sample_from_dict(d) for d in g] for g in p["queue"]["groups"]],
        counters=QueueCounters(**p["queue"]["counters"]),
    )
    return queue, [_rollouter_from_dict(r) for r in p["rollouters"]]


def _rollouter_to_dict(state: PauseState) -> dict[str, Any]:
    out: dict[str, Any] = {
        "pending": [[sample_to_dict(s) for s in g] for g in state.pending],
        "parked": [[asdict(p) for p in unit] for unit in state.parked],
        "prompts": state.prompts,
        "in_flight": state.in_flight,
    }
    if state.sampler is not None:
        out["sampler"] = base64.b64encode(state.sampler).decode("ascii")
    return out


def _rollouter_from_dict(d: dict[str, Any]) -> PauseState:
    units = d.get("parked")
    if units is None:  # written before parking kept one unit per thread: at most one unit
        units = [d["parked_prompts"]] if d.get("parked_prompts") else []
    return PauseState(
        pending=[[sample_from_dict(s) for s in g] for g in d["pending"]],
        parked=[[Prompt(**p) for p in unit] for unit in units],
        prompts=d["prompts"],
        in_flight=int(d["in_flight"]),
        sampler=base64.b64decode(d["sampler"]) if d.get("sampler") is not None else None,
    )

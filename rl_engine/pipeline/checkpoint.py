"""Checkpoint bookkeeping: names, pruning, and the pipeline part of the checkpoint (``extra``).

The trainer writes model/optimizer/RNG/step atomically (``save_checkpoint(path, extra)``); the
pipeline adds, JSON-serialisable, everything needed for a lossless resume: queued groups, each
rollouter's unfinished (interrupted) groups and admitted-but-unstarted prompts, each rollouter's
prompt-stream position, and the queue's counters (so conservation holds across the restart).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from rl_engine.pipeline.rollouter import sample_from_dict, sample_to_dict

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


def pipeline_extra(step: int, queue_snapshot: dict[str, Any], rollouter_states: list[dict[str, Any]]) -> dict:
    return {
        "pipeline": {
            "format": FORMAT,
            "step": step,
            "queue": {
                "groups": [[sample_to_dict(s) for s in g] for g in queue_snapshot["groups"]],
                "counters": queue_snapshot["counters"],
            },
            "rollouters": rollouter_states,
        }
    }


def restore_parts(extra: dict[str, Any], num_rollouters: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Split a checkpoint's ``extra`` into the queue state and per-rollouter states (validated)."""
    p = extra.get("pipeline")
    if not p or p.get("format") != FORMAT:
        raise ValueError(f"the checkpoint has no pipeline state (format {FORMAT} expected)")
    if len(p["rollouters"]) != num_rollouters:
        raise ValueError(
            f"the checkpoint was written with {len(p['rollouters'])} rollouters; "
            f"set pipeline.num_rollouters={len(p['rollouters'])} to resume it"
        )
    queue = {
        "groups": [[sample_from_dict(d) for d in g] for g in p["queue"]["groups"]],
        "counters": p["queue"]["counters"],
    }
    return queue, p["rollouters"]

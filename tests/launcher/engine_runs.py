"""Real engine runs for the end-to-end tests: a tiny config whose every metric is also written to a local
JSONL file (the engine's own record, the ground truth the platform's copy is compared with)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any


def tiny_config(tmp: Path, *, steps: int, **trainer: Any) -> dict:
    """demo-cpu made small (16 samples a step) so a step takes a fraction of a second; every metric is
    also written to a local JSONL file, the ground truth the platform's copy is compared with."""
    from tests.factories import demo_config

    cfg = demo_config()
    cfg["rollout"]["n"] = 4
    cfg["trainer"].update(total_steps=steps, batch_size=16, mini_batch_size=16, **trainer)
    cfg["logging"] = {"sinks": ["stdout", "jsonl"], "jsonl_path": str(tmp / f"metrics-{time.time_ns()}.jsonl"),
                      "log_every": 1, "progress_bar": False}  # fmt: skip
    return cfg


def jsonl_records(path: str | Path) -> list[tuple[str, int, float]]:
    """Every (key, step, value) the engine logged to ``path``, in order (a resumed run appends to the
    file of the run it continues)."""
    out = []
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "metrics":  # non-finite values are not sent (JSON has no NaN)
            out += [
                (k, int(rec["step"]), float(v)) for k, v in rec["metrics"].items() if math.isfinite(float(v))
            ]
    return out


def jsonl_points(run: Any) -> set[tuple[str, int, float]]:
    """Every (key, step, value) the run's engine logged, from its local JSONL file."""
    return set(jsonl_records(run.config["logging"]["jsonl_path"]))


def db_points(run: Any) -> list[tuple[str, int, float]]:
    return list(run.metric_points.values_list("key", "step", "value"))

"""Real engine runs for the end-to-end tests: a tiny config whose every metric is also written to a local
JSONL file (the engine's own record, the ground truth the platform's copy is compared with)."""

from __future__ import annotations

import json
import math
from typing import Any


def tiny_config(*, steps: int, **trainer: Any) -> dict:
    """demo-cpu made small (16 samples a step) so a step takes a fraction of a second; every metric is
    also written to a local JSONL file (in the run's folder: the platform puts it there), the ground
    truth the platform's copy is compared with."""
    from tests.factories import demo_config

    cfg = demo_config()
    cfg["rollout"]["n"] = 4
    cfg["trainer"].update(total_steps=steps, batch_size=16, mini_batch_size=16, **trainer)
    cfg["logging"] = {"sinks": ["stdout", "jsonl"], "log_every": 1}
    return cfg


def jsonl_records(run: Any) -> list[tuple[str, int, float]]:
    """Every (key, step, value) the run's engine logged to its JSONL file, in order (each run, a resumed
    one too, writes its own file in its own folder)."""
    from experiments.run_files import jsonl_log

    out = []
    for line in jsonl_log(run).read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "metrics":  # non-finite values are not sent (JSON has no NaN)
            out += [
                (k, int(rec["step"]), float(v)) for k, v in rec["metrics"].items() if math.isfinite(float(v))
            ]
    return out


def jsonl_points(run: Any) -> set[tuple[str, int, float]]:
    """Every (key, step, value) the run's engine logged, from its local JSONL file."""
    return set(jsonl_records(run))


def db_points(run: Any) -> list[tuple[str, int, float]]:
    return list(run.metric_points.values_list("key", "step", "value"))

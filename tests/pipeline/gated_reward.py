"""A reward factory for pipeline tests (imported by name in the rollouter actors): the run's real reward,
except that scoring a validation response of the evaluation on weights ``version`` waits until the file
``gate`` exists. So the test decides when that evaluation may finish, whatever the machine's speed."""

from __future__ import annotations

import os
import time
from typing import Any

from rl_engine.config import ExperimentConfig
from rl_engine.rewards import SafeReward, build_reward
from rl_engine.types import Sample

GATE_WAIT_S = 60.0  # a gate that never opens releases the evaluation after this (the test then fails)


def gated_reward(cfg: ExperimentConfig, index: int = 0, *, gate: str, version: int) -> SafeReward:
    inner = build_reward(cfg.reward)
    deadline: list[float] = []  # the first gated response starts the one wait of GATE_WAIT_S

    def fn(sample: Sample) -> float:
        if sample.prompt_uid.startswith("v") and sample.param_version_start == version:
            deadline[:] = deadline or [time.monotonic() + GATE_WAIT_S]
            while not os.path.exists(gate) and time.monotonic() < deadline[0]:
                time.sleep(0.05)
        return inner(sample)

    return SafeReward(fn, cfg.reward.name)


def open_gate(path: Any) -> None:
    with open(path, "w", encoding="utf-8"):
        pass

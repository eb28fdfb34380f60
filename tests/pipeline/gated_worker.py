"""A rollout worker factory for pipeline tests (imported by name in the rollouter actors): the
simulated worker, except that on rollouter ``gated_index`` every ``generate`` / ``resume`` call waits
until the file ``gate`` exists. So the test decides when that rollouter's running call returns (and
with ``pipeline.partial_rollout`` off, when its ``pause`` can), whatever the machine's speed."""

from __future__ import annotations

import os
import time
from typing import Any

from harness.simulated import SimRolloutWorker
from rl_engine.config import ExperimentConfig
from rl_engine.types import Prompt, Sample

GATE_WAIT_S = 60.0  # a gate that never opens releases the call after this (the test then fails)


class _GatedWorker(SimRolloutWorker):
    def __init__(self, cfg: ExperimentConfig, index: int, gate: str, **kw: Any) -> None:
        super().__init__(cfg, index, **kw)
        self.gate = gate

    def _wait_gate(self) -> None:
        deadline = time.monotonic() + GATE_WAIT_S
        while not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.05)

    def generate(self, prompts: list[Prompt], n: int) -> list[Sample]:
        self._wait_gate()
        return super().generate(prompts, n)

    def resume(self, samples: list[Sample]) -> list[Sample]:
        self._wait_gate()
        return super().resume(samples)


def gated_worker(
    cfg: ExperimentConfig, index: int = 0, *, gate: str, gated_index: int, **kw: Any
) -> SimRolloutWorker:
    if index == gated_index:
        return _GatedWorker(cfg, index, gate, **kw)
    return SimRolloutWorker(cfg, index, **kw)

"""A reward factory for pipeline tests (imported by name in the rollouter actors): the run's real reward,
recording each scored sample (its prompt, response token ids and weights versions) as a JSON line in
``path``, so a test can compare what two runs sampled."""

from __future__ import annotations

import json
import threading

from rl_engine.config import ExperimentConfig
from rl_engine.rewards import SafeReward, build_reward
from rl_engine.types import Sample


def recording_reward(cfg: ExperimentConfig, index: int = 0, *, path: str) -> SafeReward:
    inner, lock = build_reward(cfg.reward), threading.Lock()

    def fn(sample: Sample) -> float:
        line = {
            "rollouter": index,
            "prompt_uid": sample.prompt_uid,
            "response_ids": sample.response_ids,
            "versions": [sample.param_version_start, sample.param_version_end],
        }
        with lock, open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
        return inner(sample)

    return SafeReward(fn, cfg.reward.name)

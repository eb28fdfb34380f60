"""A short run on reasoning-gym prompts with a weighted-sum reward, through the real pipeline (Ray actors,
the HF worker and PolicyTrainer on the tiny model): the prompts' entries reach the reward in the
rollouter, each component's mean is in every step's metrics and the step's reward is their weighted sum,
and the held-out evaluation scores the test split."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rl_engine.config import parse_config
from rl_engine.pipeline import run_experiment
from rl_engine.presets import get_preset
from tests.pipeline.conftest import RecordingSink

pytestmark = pytest.mark.timeout(300)

WEIGHTS = {"reasoning_gym": 1.0, "format": 0.5, "contains": -0.25}


def test_a_run_reports_each_components_mean_and_their_weighted_sum(ray_session, tiny_dir: Path):
    data = get_preset("demo-cpu")
    data["model"] = {"path": str(tiny_dir)}
    data["rollout"].update({"n": 4, "max_new_tokens": 4, "max_prompt_tokens": 200})
    data["trainer"].update({"total_steps": 2, "batch_size": 16, "mini_batch_size": 16})
    data["data"] = {
        "source": "reasoning_gym",
        "datasets": [{"name": "chain_sum", "config": {"max_terms": 2, "max_digits": 1}}],
        "train_size": 64,
        "test_size": 4,
        "chat_template": "off",
    }
    data["reward"] = {
        "combine": [
            {"name": "reasoning_gym", "kwargs": {"extract": "none"}, "weight": WEIGHTS["reasoning_gym"]},
            {"name": "format", "kwargs": {"pattern": ".", "full": False}, "weight": WEIGHTS["format"]},
            {"name": "contains", "weight": WEIGHTS["contains"]},
        ]
    }
    data["eval"] = {"at_end": True, "prompts_per_call": 4}
    data["logging"] = {"sinks": [], "log_every": 1}
    sink = RecordingSink()
    summary = run_experiment(parse_config(data), sink)
    assert summary.steps_done == 2

    train = [m for _, m in sink.metrics if "reward/mean" in m]
    assert len(train) == 2
    for m in train:
        means = {k: m[f"reward/{k}/mean"] for k in WEIGHTS}
        assert 0.0 <= means["reasoning_gym"] <= 1.0 and 0.0 <= means["format"] <= 1.0
        weighted = sum(WEIGHTS[k] * means[k] for k in WEIGHTS)
        assert math.isclose(m["reward/mean"], weighted, abs_tol=1e-9), m
        assert m["reward/errors"] == 0  # every prompt carried its entry to the rollouter's reward
    [val] = [m for _, m in sink.metrics if "val/num_prompts" in m]
    assert val["val/num_prompts"] == 4 and val["val/reward_errors"] == 0
    val_means = {k: val[f"val/reward/{k}/mean"] for k in WEIGHTS}
    weighted = sum(WEIGHTS[k] * val_means[k] for k in WEIGHTS)
    assert math.isclose(val["val/reward_mean"], weighted, abs_tol=1e-9), val

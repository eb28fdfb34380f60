"""Reward registry: lookups by name, kwargs from config, clear errors."""

from __future__ import annotations

import pytest

from rl_engine.config import RewardConfig
from rl_engine.rewards import build_reward, reward_names
from rl_engine.types import Sample


def _s(response: str, answer: str) -> Sample:
    return Sample(
        prompt_uid="p",
        group_id="g",
        prompt_ids=[1],
        response_ids=[2],
        logprobs=[0.0],
        finish_reason="stop",
        param_version_start=0,
        param_version_end=0,
        response_text=response,
        answer=answer,
    )


def test_exact_match_with_strip_case_and_prefix_credit():
    em = build_reward(RewardConfig(name="exact_match"))
    assert em(_s(" k \n", "k")) == 1.0
    assert em(_s("kk", "k")) == 0.0
    assert em(_s("K", "k")) == 0.0
    assert (
        build_reward(RewardConfig(name="exact_match", kwargs={"case_sensitive": False}))(_s("K", "k")) == 1.0
    )
    shaped = build_reward(RewardConfig(name="exact_match", kwargs={"prefix_credit": 0.5}))
    assert [shaped(_s(r, "k")) for r in ["k", "kx", "xk", ""]] == [1.0, 0.5, 0.0, 0.0]


def test_numeric_answer_uses_marker_or_last_number():
    num = build_reward(RewardConfig(name="numeric_answer"))
    assert num(_s("so it is 1,234.0", "steps... #### 1234")) == 1.0
    assert num(_s("first 3 then 5", "5")) == 1.0
    assert num(_s("#### 4 and later 7", "4")) == 0.0  # the last number after the last marker is 7
    assert num(_s("no number", "4")) == 0.0
    assert num(_s("-2.5", "-2.5")) == 1.0


def test_format_reward_is_a_regex_not_code():
    fmt = build_reward(RewardConfig(name="format", kwargs={"pattern": r"<answer>\d+</answer>"}))
    assert fmt(_s("<answer>42</answer>", "")) == 1.0
    assert fmt(_s("x <answer>42</answer>", "")) == 0.0
    search = build_reward(
        RewardConfig(name="format", kwargs={"pattern": r"\d+", "full": False, "reward": 0.2})
    )
    assert search(_s("x 42", "")) == 0.2
    assert build_reward(RewardConfig(name="contains"))(_s("the answer is 7.", "7")) == 1.0


def test_registry_errors_name_the_choices():
    assert {"exact_match", "numeric_answer", "format"} <= set(reward_names())
    with pytest.raises(ValueError, match="unknown reward 'python'; choose one of"):
        build_reward(RewardConfig(name="python", kwargs={"code": "import os"}))
    with pytest.raises(ValueError, match="it takes: strip, case_sensitive, prefix_credit"):
        build_reward(RewardConfig(name="exact_match", kwargs={"bogus": 1}))
    with pytest.raises(ValueError, match="not a valid regular expression"):
        build_reward(RewardConfig(name="format", kwargs={"pattern": "("}))

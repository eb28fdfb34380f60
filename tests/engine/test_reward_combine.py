"""``reward.combine``: a weighted sum of rewards. Each sample's reward is the sum of weight x score of its
components, each built alone as the reference; each component's score is kept on the sample and its mean
is a step metric."""

from __future__ import annotations

import math

import pytest

from rl_engine.config import ConfigError, parse_config
from rl_engine.pipeline.metrics import step_metrics
from rl_engine.rewards import build_reward, component_means
from rl_engine.types import QueueStats, Sample, StepResult

COMPONENTS = [
    {"name": "numeric_answer", "weight": 1.0},
    {"name": "format", "kwargs": {"pattern": r".*#### -?\d+", "full": True}, "weight": 0.1},
    {"name": "contains", "weight": -0.25, "label": "contains_penalty"},
]


def config(reward: dict) -> dict:
    return {"model": {"path": "m"}, "reward": reward}


def sample(response: str, answer: str) -> Sample:
    return Sample("p", "g", [], [], [], "stop", 0, 0, response_text=response, answer=answer)


RESPONSES = [
    ("so #### 12", "12"),
    ("12", "12"),
    ("#### 13", "12"),
    ("nothing here", "12"),
    ("the answer is 3.5", "3.5"),
]


def test_the_combination_is_the_weighted_sum_of_its_components_built_alone():
    combined = build_reward(parse_config(config({"combine": COMPONENTS})).reward)
    alone = [
        (
            part["weight"],
            build_reward(
                parse_config(config({"name": part["name"], "kwargs": part.get("kwargs", {})})).reward
            ),
        )
        for part in COMPONENTS
    ]
    totals = []
    for response, answer in RESPONSES:
        s = sample(response, answer)
        total = combined(s)
        expected = sum(weight * fn(sample(response, answer)) for weight, fn in alone)
        assert math.isclose(total, expected, abs_tol=1e-12), (response, total, expected)
        scores = [fn(sample(response, answer)) for _, fn in alone]
        assert [
            s.extra["reward/numeric_answer"],
            s.extra["reward/format"],
            s.extra["reward/contains_penalty"],
        ] == scores
        totals.append(total)
    assert len(set(totals)) > 2  # the cases tell the components apart
    assert combined.stats() == {
        "reward/errors": 0.0,
        "reward/calls": float(len(RESPONSES)),
        "reward/unscored": 0.0,
    }


def test_a_failing_component_scores_zero_and_the_others_still_count():
    combined = build_reward(
        parse_config(
            config({"combine": [{"name": "numeric_answer"}, {"name": "math_verify", "weight": 2.0}]})
        ).reward
    )
    s = sample("#### 12", "")  # math-verify finds no reference answer to parse: it raises
    total = combined(s)
    assert s.extra["reward_error"] == 1.0 and s.extra["reward/math_verify"] == 0.0
    assert total == s.extra["reward/numeric_answer"] == 0.0
    ok = sample("#### 12", "12")
    assert combined(ok) == 1.0 + 2.0 * 1.0
    assert combined.stats() == {"reward/errors": 1.0, "reward/calls": 2.0, "reward/unscored": 0.0}


def test_a_single_reward_config_is_unchanged():
    cfg = parse_config(config({"name": "exact_match", "kwargs": {"prefix_credit": 0.5}}))
    assert cfg.reward.combine is None
    fn = build_reward(cfg.reward)
    s = sample("ab", "a")
    assert fn(s) == 0.5 and not any(k.startswith("reward/") for k in s.extra)
    assert parse_config(cfg.model_dump()) == cfg


def test_combination_config_errors_name_their_fields():
    cases = [
        ({"name": "contains", "combine": [{"name": "exact_match"}]}, "reward", "not both"),
        ({"kwargs": {"strip": False}, "combine": [{"name": "exact_match"}]}, "reward", "not both"),
        ({"combine": [{"name": "exact_match"}, {"name": "exact_match"}]}, "reward.combine[1].label", "label"),
        (
            {"combine": [{"name": "exact_match"}, {"name": "nope"}]},
            "reward.combine[1].name",
            "unknown reward",
        ),
        ({"combine": [{"name": "format", "kwargs": {"pattern": "("}}]}, "reward.combine[0].kwargs", "RE2"),
        ({"combine": [{"name": "exact_match", "weight": math.inf}]}, "reward.combine[0].weight", ""),
        ({"combine": [{"name": "exact_match", "label": "a b"}]}, "reward.combine[0].label", ""),
        ({"combine": []}, "reward.combine", "at least 1"),
    ]
    for reward, path, message in cases:
        with pytest.raises(ConfigError) as info:
            parse_config(config(reward))
        [(where, msg)] = info.value.errors
        assert where == path and message in msg, (reward, where, msg)


def test_a_combination_round_trips_through_its_dump():
    cfg = parse_config(config({"combine": COMPONENTS}))
    again = parse_config(cfg.model_dump())
    assert again == cfg and [c.key for c in again.reward.combine] == [
        "numeric_answer",
        "format",
        "contains_penalty",
    ]


def test_each_components_mean_becomes_a_step_metric():
    combined = build_reward(parse_config(config({"combine": COMPONENTS})).reward)
    batch = [sample(r, a) for r, a in RESPONSES]
    rewards = [combined(s) for s in batch]
    parts = component_means([s.extra for s in batch])
    assert parts == {
        "reward/contains_penalty/mean": sum(s.extra["reward/contains_penalty"] for s in batch) / len(batch),
        "reward/format/mean": sum(s.extra["reward/format"] for s in batch) / len(batch),
        "reward/numeric_answer/mean": sum(s.extra["reward/numeric_answer"] for s in batch) / len(batch),
    }
    result = StepResult(
        version=1,
        trainer_metrics={},
        wait_s=0.0,
        train_s=0.1,
        dropped_now=0,
        staleness=[0] * len(batch),
        rewards=rewards,
        lengths=[1] * len(batch),
        partial=[False] * len(batch),
        gen_s=[0.0] * len(batch),
        uids=[str(i) for i in range(len(batch))],
        examples=[],
        reward_parts=parts,
    )
    metrics = step_metrics(
        result,
        step_wall_s=1.0,
        sync_s=None,
        queue_stats=QueueStats(
            queued=0, max_depth=0, admitted=0, generated=0, consumed=0, dropped_stale=0, failure=None
        ),
        rollout_busy_delta_s=[],
        gen_window_s=1.0,
    )
    assert {k: metrics[k] for k in parts} == parts
    weights = {"numeric_answer": 1.0, "format": 0.1, "contains_penalty": -0.25}
    weighted = sum(w * metrics[f"reward/{k}/mean"] for k, w in weights.items())
    assert math.isclose(metrics["reward/mean"], weighted, abs_tol=1e-12)


def test_an_example_sample_carries_each_components_score():
    """The trainer's example samples (the run page's sample browser) carry the components' scores, as
    each component built alone scores the response; a single reward's example has none."""
    import random
    from types import SimpleNamespace

    from rl_engine.pipeline.trainer_actor import TrainerActor

    combined = build_reward(parse_config(config({"combine": COMPONENTS})).reward)
    batch = [sample(response, answer) for response, answer in RESPONSES]
    for s in batch:
        s.reward = combined(s)
    examples = TrainerActor._examples(SimpleNamespace(_rng=random.Random(0)), batch, len(batch))
    assert len(examples) == len(batch)
    for ex in examples:
        [s] = [s for s in batch if s.response_text == ex.response]
        expected = {
            part.get("label", part["name"]): build_reward(
                parse_config(config({"name": part["name"], "kwargs": part.get("kwargs", {})})).reward
            )(sample(s.response_text, s.answer))
            for part in COMPONENTS
        }
        assert ex.reward_parts == expected and ex.to_dict()["reward_parts"] == expected
        assert math.isclose(
            ex.reward, sum(p["weight"] * expected[p.get("label", p["name"])] for p in COMPONENTS)
        )
    single = sample("#### 12", "12")
    single.reward = build_reward(parse_config(config({"name": "numeric_answer"})).reward)(single)
    [ex] = TrainerActor._examples(SimpleNamespace(_rng=random.Random(0)), [single], 1)
    assert ex.reward_parts is None and "reward_parts" not in ex.to_dict()


def test_a_samples_parts_are_bounded_for_the_wire():
    from rl_engine.rewards.base import MAX_SAMPLE_PARTS, sample_parts
    from rl_engine.wire import SampleIn

    extra = {f"reward/c{i:02d}": float(i) for i in range(40)}
    extra |= {"reward/bad": float("nan"), "reward/" + "x" * 201: 1.0, "reward_error": 1.0}
    parts = sample_parts(extra)
    assert parts == {f"c{i:02d}": float(i) for i in range(MAX_SAMPLE_PARTS)}
    SampleIn.model_validate({"prompt": "p", "response": "r", "reward_parts": parts})  # the wire takes it

"""The reward model (``reward: {name: model}``) on its own Ray actor: a sequence classifier built here
(the tiny causal LM's weights under a randomly initialised one-logit head: right for the plumbing, not a
judge of anything) scores batches exactly as transformers scores each text alone, unpadded; the run's
rewards share one actor; a text over ``max_length`` keeps its end; a dead actor leaves its batch unscored
and the next batch gets a new one."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
import torch

from rl_engine.config import ConfigError, parse_config
from rl_engine.rewards import build_reward
from rl_engine.rewards.base import score_samples
from rl_engine.types import UNSCORED, Sample

pytestmark = pytest.mark.timeout(300)

TEXTS = [
    ("user: 2+3?", "5"),
    ("user: say hi", "hi there, friend"),
    ("q", "a much longer answer than the rest"),
    ("x", ""),
]


@pytest.fixture(scope="module")
def classifier(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path_factory.mktemp("classifier")
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_dir, num_labels=1)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(out)
    return out


def reference_scores(folder: Path, texts: list[str], max_length: int = 1024) -> list[float]:
    """Each text alone through transformers: no padding, its last ``max_length`` tokens."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    out = []
    for text in texts:
        ids = tok(text)["input_ids"][-max_length:]
        with torch.no_grad():
            out.append(float(model(input_ids=torch.tensor([ids])).logits[0, 0]))
    return out


def reward(folder: Path, **kwargs):
    cfg = {"model": {"path": "m"}, "reward": {"name": "model", "kwargs": {"path": str(folder), **kwargs}}}
    return build_reward(parse_config(cfg).reward)


def samples() -> list[Sample]:
    return [
        Sample(str(i), str(i), [], [], [], "stop", 0, 0, prompt_text=p, response_text=r)
        for i, (p, r) in enumerate(TEXTS)
    ]


def test_the_actor_scores_batches_as_transformers_scores_each_text_alone(ray_session, classifier):
    first, second = reward(classifier, batch_size=3), reward(classifier, batch_size=3)
    batch = samples()
    score_samples(first, batch)
    expected = reference_scores(classifier, [p + r for p, r in TEXTS])
    assert [s.reward for s in batch] == pytest.approx(expected, abs=1e-5)
    assert len(set(expected)) == len(expected)  # the texts get different scores: the order is checked
    # one actor per run and model: the second reward (another rollouter, the evaluator) finds it
    name = first.fn.actor_name
    assert ray.get_actor(name) is not None
    # (get_if_exists: a second actor of that name would be refused; a different name would be a copy)
    second_batch = samples()
    score_samples(second, second_batch)
    assert second.fn.actor_name == name and [s.reward for s in second_batch] == [s.reward for s in batch]


def test_a_text_over_max_length_keeps_its_end(ray_session, classifier):
    long = Sample("l", "l", [], [], [], "stop", 0, 0, prompt_text="q " * 40, response_text="the end 42")
    score_samples(reward(classifier, max_length=16), [long])
    [expected] = reference_scores(classifier, [long.prompt_text + long.response_text], max_length=16)
    assert long.reward == pytest.approx(expected, abs=1e-5)


def test_a_dead_actor_leaves_its_batch_unscored_and_the_next_batch_gets_a_new_one(ray_session, classifier):
    fn = reward(classifier, batch_size=2, max_length=512)
    score_samples(fn, samples())
    ray.kill(ray.get_actor(fn.fn.actor_name))
    batch = samples()
    score_samples(fn, batch)
    assert all(s.extra.get(UNSCORED) for s in batch) and fn.stats()["reward/unscored"] == len(batch)
    again = samples()
    score_samples(fn, again)
    assert not any(UNSCORED in s.extra for s in again)
    expected = reference_scores(classifier, [p + r for p, r in TEXTS], max_length=512)
    assert [s.reward for s in again] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "path"),
        ({"path": "x", "batch_size": 0}, "batch_size"),
        ({"path": "x", "num_gpus": -1}, "num_gpus"),
    ],
)
def test_bad_reward_model_settings_are_config_errors_naming_the_field(kwargs, message):
    with pytest.raises(ConfigError) as err:
        parse_config({"model": {"path": "m"}, "reward": {"name": "model", "kwargs": kwargs}})
    assert "reward.kwargs" in str(err.value) and message in str(err.value)


def test_an_actor_the_cluster_cannot_place_leaves_the_batch_unscored_after_timeout_s(ray_session, classifier):
    """num_gpus 1 on a cluster without GPUs: the actor never starts; the batch waits timeout_s, not forever."""
    fn = reward(classifier, num_gpus=1, timeout_s=2)
    batch = samples()
    score_samples(fn, batch)
    assert all(s.extra.get(UNSCORED) for s in batch)
    ray.kill(ray.get_actor(fn.fn.actor_name))

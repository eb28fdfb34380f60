"""Held-out evaluation on the real tiny model and HF rollout worker: greedy is argmax decoding, pass@k,
the val/ metrics, chunking with a hold around each chunk, config checks."""

from __future__ import annotations

import itertools
import statistics

import pytest
import torch

from rl_engine.backends import build_rollout_worker
from rl_engine.config import ConfigError, RewardConfig
from rl_engine.evaluation import Evaluator, pass_at_k
from rl_engine.rewards import SafeReward, build_reward

EVAL = ["data.num_validation_prompts=6", "eval.every=5", "rollout.max_new_tokens=4"]
# A random tiny model rarely answers a task right; a response that starts with a letter is common
# enough (about half the vocabulary) to give pass@k something to count.
LETTER_FIRST = RewardConfig(name="format", kwargs={"pattern": "[a-z].*"})


def test_pass_at_k_is_the_unbiased_estimator():
    for n in range(1, 6):
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
                brute = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(brute), (n, c, k)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_greedy_evaluation_is_argmax_decoding_and_restores_sampling(make_cfg):
    cfg = make_cfg(*EVAL, "eval.prompts_per_call=4")
    worker = build_rollout_worker(cfg)
    original = worker.cfg
    ev = Evaluator.from_config(cfg, worker.tokenizer, build_reward(LETTER_FIRST))
    assert ev is not None and [len(c) for c in ev.chunks()] == [4, 2]
    first, second = ev.run(worker), ev.run(worker)
    assert worker.cfg is original  # the worker samples as before afterwards
    assert [s.response_ids for s in first.samples] == [s.response_ids for s in second.samples]
    # the same responses as transformers' own greedy search on the same model
    model = worker.model
    for p, s in zip(ev.prompts, first.samples, strict=True):
        with torch.no_grad():
            out = model.generate(
                torch.tensor([p.token_ids]),
                attention_mask=torch.ones(1, len(p.token_ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=4,
                eos_token_id=worker.special.eos_ids,
                pad_token_id=worker.special.pad_id,
            )
        assert out[0, len(p.token_ids) :].tolist()[: len(s.response_ids)] == s.response_ids
    m = first.metrics
    rewards = [s.reward for s in first.samples]
    assert m["val/reward_mean"] == pytest.approx(statistics.fmean(rewards))
    assert m["val/pass@1"] == pytest.approx(statistics.fmean(r >= 1.0 for r in rewards))
    assert m["val/response_length"] == pytest.approx(
        statistics.fmean(len(s.response_ids) for s in first.samples)
    )
    assert m["val/num_prompts"] == 6 and m["val/aborted_ratio"] == 0 and m["val/reward_errors"] == 0
    assert m["val/param_version"] == m["val/param_version_end"] == 0
    assert set(m) == {
        "val/reward_mean",
        "val/pass@1",
        "val/response_length",
        "val/truncated_ratio",
        "val/aborted_ratio",
        "val/reward_errors",
        "val/num_prompts",
        "val/param_version",
        "val/param_version_end",
        "val/time_s",
    }


def test_sampled_evaluation_reports_pass_at_n(make_cfg):
    cfg = make_cfg(*EVAL, "eval.greedy=false", "eval.n=4", "eval.temperature=1.0")
    worker = build_rollout_worker(cfg)
    ev = Evaluator.from_config(cfg, worker.tokenizer, build_reward(LETTER_FIRST))
    result = ev.run(worker)
    m = result.metrics
    assert len(result.samples) == 24
    per_prompt = [[s.reward for s in result.samples[i : i + 4]] for i in range(0, 24, 4)]
    assert m["val/pass@1"] == pytest.approx(statistics.fmean(sum(g) / 4 for g in per_prompt))
    assert m["val/pass@4"] == pytest.approx(statistics.fmean(any(g) for g in per_prompt))
    assert 0 < m["val/pass@1"] < m["val/pass@4"]  # sampled responses differ within a prompt
    assert len({tuple(s.response_ids) for s in result.samples}) > 6


def test_the_hold_wraps_each_chunk_and_sampling_is_overridden_only_inside(make_cfg):
    cfg = make_cfg(*EVAL, "eval.prompts_per_call=2")
    worker = build_rollout_worker(cfg)
    ev = Evaluator.from_config(cfg, worker.tokenizer)
    seen = []

    class Hold:
        def __enter__(self):
            seen.append(("enter", worker.cfg.top_p))

        def __exit__(self, *exc):
            seen.append(("exit", worker.cfg.top_p))

    generate = worker.generate
    worker.generate = lambda prompts, n: (seen.append(("generate", worker.cfg.top_p)), generate(prompts, n))[
        1
    ]
    score = ev.score
    ev.score = lambda samples: (seen.append(("score", worker.cfg.top_p)), score(samples))[1]
    ev.run(worker, hold=Hold)
    # scoring needs no worker: it runs after the hold is given back
    assert [k for k, _ in seen] == ["enter", "generate", "exit", "score"] * 3
    assert [tp for k, tp in seen if k != "generate"] == [1.0] * 9  # training sampling between chunks
    assert all(tp < 1e-6 for k, tp in seen if k == "generate")


def test_an_interrupted_worker_ends_the_evaluation_with_aborted_samples(make_cfg):
    cfg = make_cfg(*EVAL)
    worker = build_rollout_worker(cfg)
    ev = Evaluator.from_config(cfg, worker.tokenizer)
    worker.interrupt()  # e.g. a weight update arrived: no resume loop, the aborted share is reported
    m = ev.run(worker).metrics
    assert m["val/aborted_ratio"] == 1.0 and m["val/response_length"] == 0


def test_responses_whose_reward_raises_are_counted_and_score_zero(make_cfg):
    cfg = make_cfg(*EVAL)
    worker = build_rollout_worker(cfg)

    def flaky(sample):
        if sample.prompt_uid in {"v0", "v3"}:
            raise ValueError("unparsable answer")
        return 1.0

    ev = Evaluator.from_config(cfg, worker.tokenizer, SafeReward(flaky, "flaky"))
    m = ev.run(worker).metrics
    assert m["val/reward_errors"] == 2 and m["val/reward_mean"] == pytest.approx(4 / 6)


def test_eval_config_checks(make_cfg):
    assert Evaluator.from_config(make_cfg(), None) is None  # evaluation off
    with pytest.raises(ConfigError, match="eval is enabled but data has no validation prompts"):
        make_cfg("eval.every=10")
    with pytest.raises(ConfigError, match="greedy decoding gives n identical responses"):
        make_cfg(*EVAL, "eval.n=4")

"""The remote reward service (``reward: {name: http}``): the reference service runs as a real process
(uvicorn) and its scores equal the built-in graders computed here alone; batches keep their order;
a dead or broken service leaves samples unscored and counted (never a 0), retries are counted and
bounded; and an unscored sample takes no part in the update (the trainer's weights after a step do not
depend on its reward)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from harness.reward_service import RewardServiceProcess
from rl_engine.algos.advantages import get_advantage_fn, group_indices, scored_advantages
from rl_engine.config import ConfigError, parse_config
from rl_engine.pipeline.metrics import step_metrics
from rl_engine.pipeline.reward_alarm import UnscoredAlarm
from rl_engine.rewards import build_reward
from rl_engine.rewards.base import score_samples
from rl_engine.rewards.math_answers import math_verify_reward
from rl_engine.types import UNSCORED, QueueStats, Sample, StepResult

pytestmark = pytest.mark.timeout(120)

ANSWERS = [("so it is 12", "12"), ("#### 7", "7"), ("I think 3", "4"), ("no idea", "5"), ("1/2", "0.5")]


def sample(response: str, answer: str, group: str = "g", uid: str = "p") -> Sample:
    return Sample(
        uid, group, [], [], [], "stop", 0, 0, prompt_text="Q: ", response_text=response, answer=answer
    )


def reward_for(url: str, **kwargs) -> object:
    return build_reward(
        parse_config(
            {"model": {"path": "m"}, "reward": {"name": "http", "kwargs": {"url": url, **kwargs}}}
        ).reward
    )


@pytest.fixture(scope="module")
def service() -> Iterator[RewardServiceProcess]:
    proc = RewardServiceProcess().start()
    yield proc
    proc.kill()


def test_the_reference_service_scores_as_the_built_in_grader_does_in_batches_and_in_order(service):
    reward = reward_for(service.url("math_verify"), batch_size=2, concurrency=3)
    samples = [sample(r, a, uid=str(i)) for i, (r, a) in enumerate(ANSWERS * 3)]
    score_samples(reward, samples)
    alone = math_verify_reward()
    expected = [alone(sample(r, a)) for r, a in ANSWERS * 3]
    assert [s.reward for s in samples] == expected
    assert sum(expected) >= 3  # the batch mixes right and wrong answers
    assert not any(UNSCORED in s.extra for s in samples)
    assert reward.stats()["reward/unscored"] == 0
    assert reward.stats()["reward/calls"] == len(samples)
    assert reward.fn.stats().requests == 8  # 15 samples in batches of 2


def test_a_dead_service_leaves_every_sample_unscored_and_counted_after_its_retries():
    gone = RewardServiceProcess().start()
    reward = reward_for(gone.url("math_verify"), batch_size=4, retries=2, backoff_s=0.01, timeout_s=2)
    gone.kill()
    samples = [sample(r, a) for r, a in ANSWERS]
    for s in samples:
        s.reward = 123.0  # whatever it held is not kept as a score
    score_samples(reward, samples)
    assert all(s.extra[UNSCORED] == 1.0 and s.reward == 0.0 for s in samples)
    assert reward.stats()["reward/unscored"] == len(samples)
    assert reward.stats()["reward/errors"] == 0  # unscored is not an error that scores 0
    stats = reward.fn.stats()
    assert (stats.requests, stats.retries, stats.failed_batches) == (6, 4, 2)  # 2 batches x 3 tries


class Flaky(BaseHTTPRequestHandler):
    """A stand-in grader with scripted answers (the failures a real one has: 503s, wrong shapes)."""

    script: list[tuple[int, object]] = []
    seen: list[dict] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Flaky.seen.append(body)
        status, payload = Flaky.script.pop(0) if Flaky.script else (200, None)
        if payload is None:
            payload = {"rewards": [len(r) for r in body["responses"]]}
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    Flaky.script, Flaky.seen = [], []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/grade"
    server.shutdown()


def test_a_503_is_retried_and_then_scores(flaky):
    Flaky.script = [(503, {"error": "busy"}), (503, {"error": "busy"})]
    reward = reward_for(flaky, retries=2, backoff_s=0.01)
    samples = [sample("abc", "x"), sample("hello", "y")]
    score_samples(reward, samples)
    assert [s.reward for s in samples] == [3.0, 5.0]
    assert reward.fn.stats().retries == 2
    sent = Flaky.seen[-1]
    assert sent["responses"] == ["abc", "hello"] and sent["labels"] == ["x", "y"]
    assert sent["query"] == ["Q: abc", "Q: hello"] and sent["prompts"] == ["Q: ", "Q: "]


@pytest.mark.parametrize(
    "answer",
    [
        (200, {"rewards": [1.0]}),  # one result for two samples
        (200, {"scores": [1.0, 1.0]}),
        (200, {"rewards": [1.0, "high"]}),
        (200, {"rewards": [1.0, float("nan")]}),
        (400, {"error": "bad batch"}),  # a 4xx is final: no retry
    ],
)
def test_an_answer_outside_the_protocol_leaves_the_batch_unscored_without_retrying(flaky, answer):
    Flaky.script = [answer]
    reward = reward_for(flaky, retries=3, backoff_s=0.01)
    samples = [sample("abc", "x"), sample("hello", "y")]
    score_samples(reward, samples)
    assert all(s.extra.get(UNSCORED) for s in samples)
    assert reward.fn.stats().requests == 1 and reward.stats()["reward/unscored"] == 2


def test_null_leaves_that_sample_unscored_and_a_mapping_carries_figures(flaky):
    Flaky.script = [(200, {"rewards": [None, {"score": 0.5, "tests_passed": 3}]})]
    reward = reward_for(flaky)
    samples = [sample("abc", "x"), sample("hello", "y")]
    score_samples(reward, samples)
    assert samples[0].extra[UNSCORED] == 1.0 and UNSCORED not in samples[1].extra
    assert samples[1].reward == 0.5 and samples[1].extra["reward/http/tests_passed"] == 3.0


def test_in_a_combination_a_sample_the_service_failed_is_unscored_not_partly_scored(flaky):
    Flaky.script = [(200, {"rewards": [None, 2.0]})]
    cfg = {"combine": [{"name": "http", "kwargs": {"url": flaky}}, {"name": "contains", "weight": 0.5}]}
    reward = build_reward(parse_config({"model": {"path": "m"}, "reward": cfg}).reward)
    samples = [sample("x y", "x"), sample("hello", "he")]
    score_samples(reward, samples)
    assert samples[0].extra[UNSCORED] == 1.0
    assert samples[1].reward == 2.0 + 0.5 * 1.0
    assert reward.stats()["reward/unscored"] == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"url": "http://user@grader:80/x"}, "user-info"),
        ({"url": "ftp://grader/x"}, "http"),
        ({"url": "http://grader/x?token=1"}, "query"),
        ({"url": "http://grader/x", "batch_size": 0}, "batch_size"),
        ({"url": "http://grader/x", "timeout_s": -1}, "timeout_s"),
        ({"url": "http://grader/x", "retries": "3"}, "retries"),
        ({"url": "http://grader/x", "verify": False}, "verify"),
        ({}, "url"),
    ],
)
def test_bad_service_settings_are_config_errors_naming_the_field(kwargs, message):
    with pytest.raises(ConfigError) as err:
        parse_config({"model": {"path": "m"}, "reward": {"name": "http", "kwargs": kwargs}})
    assert "reward.kwargs" in str(err.value) and message in str(err.value)


def group_samples() -> list[Sample]:
    rewards = [1.0, 0.0, 0.5, 0.25, 1.0, 1.0, 0.0, 0.75]
    return [Sample(str(i), f"g{i // 4}", [], [], [], "stop", 0, 0, reward=r) for i, r in enumerate(rewards)]


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_an_unscored_sample_gets_no_advantage_and_no_part_in_its_groups_baseline(estimator):
    fn = get_advantage_fn(estimator)
    samples = group_samples()
    for i in (1, 5, 6):
        samples[i].extra[UNSCORED] = 1.0
    adv = scored_advantages(fn, samples, norm_by_std=True)
    keep = [i for i in range(8) if i not in (1, 5, 6)]
    # the reference: the estimator on the scored samples alone, as if the others had never been drawn
    alone = fn(
        torch.tensor([samples[i].reward for i in keep]),
        group_indices([samples[i].group_id for i in keep]),
        norm_by_std=True,
    )
    assert torch.equal(adv[keep], alone)
    assert adv[[1, 5, 6]].tolist() == [0.0, 0.0, 0.0]


def test_a_steps_reward_figures_leave_unscored_samples_out():
    result = StepResult(
        version=1,
        trainer_metrics={},
        wait_s=0.0,
        train_s=1.0,
        dropped_now=0,
        staleness=[0] * 4,
        rewards=[1.0, 0.0, 0.0, 0.5],
        lengths=[3] * 4,
        partial=[False] * 4,
        gen_s=[0.1] * 4,
        uids=["a/0", "a/1", "a/2", "a/3"],
        examples=[],
        unscored=[False, True, True, False],
    )
    m = step_metrics(
        result,
        step_wall_s=1.0,
        sync_s=None,
        queue_stats=QueueStats(0, 0, 0, 0, 0, 0, None),
        rollout_busy_delta_s=[0.5],
        gen_window_s=1.0,
    )
    assert m["reward/mean"] == 0.75 and m["reward/unscored_ratio"] == 0.5


def test_the_alarm_fires_once_per_episode_over_the_threshold():
    alarm = UnscoredAlarm(0.1, "http")
    fired = [
        alarm.check(step, ratio) is not None for step, ratio in enumerate([0.0, 0.5, 1.0, 0.1, 0.2, 0.05])
    ]
    assert fired == [False, True, False, False, True, False]


def test_an_unscored_samples_reward_does_not_reach_the_update(make_cfg):
    """Two trainers from the same weights, one step on the same batch whose unscored samples hold
    different rewards: the weights after the step are equal, byte for byte."""
    from rl_engine.backends import build_rollout_worker
    from rl_engine.data import PromptStream
    from rl_engine.trainer import PolicyTrainer

    cfg = make_cfg(
        "trainer.batch_size=8", "trainer.mini_batch_size=8", "rollout.max_new_tokens=4", "rollout.n=4"
    )
    worker = build_rollout_worker(cfg)
    samples = worker.generate(PromptStream(cfg, worker.tokenizer).next_batch(2), 4)
    for i, s in enumerate(samples):
        s.reward = float(i % 3 == 0)
    for i in (1, 4):
        samples[i].extra[UNSCORED] = 1.0
    after = []
    for garbage in (0.0, 1000.0):
        for i in (1, 4):
            samples[i].reward = garbage
        trainer = PolicyTrainer(cfg)
        trainer.train_step(samples)
        after.append({k: v.detach().clone() for k, v in trainer.model.named_parameters()})
    assert all(torch.equal(after[0][k], after[1][k]) for k in after[0])
    # and the rewards of scored samples do reach it (the check above can fail)
    samples[0].reward = 1000.0
    trainer = PolicyTrainer(cfg)
    trainer.train_step(samples)
    moved = {k: v.detach() for k, v in trainer.model.named_parameters()}
    assert any(not torch.equal(moved[k], after[0][k]) for k in moved)

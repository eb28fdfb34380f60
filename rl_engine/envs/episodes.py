"""Multi-turn episodes over any rollout worker: :class:`EpisodeWorker` runs each sample as an episode of
policy turns and environment messages, one token sequence per episode (docs/engine.md, "Environments").

The wrapped worker samples every policy turn (``generate`` for the first, ``resume`` for the next: a
resumed sample continues from its prompt and response ids, exactly as partial rollout continues an
interrupted one). Between turns the environment answers (``Environment.step``) and its message's tokens
(``chat_turns.observation_ids``) are appended to the response with a loss mask of 0 and a 0.0 placeholder
log-prob; the sampled ids are never re-tokenized. So the trainer scores exactly the ids that were sampled,
with their behaviour log-probs, and trains on those alone.

What an episode is lives in its sample (``metadata["env"]``: the spans the environment wrote and its
messages; ``extra["env/..."]``: its figures), so an episode interrupted anywhere — a weight update
between or inside turns, a checkpoint — continues in another call or process with the same answers
(environments are stateless). A sample's weight versions span every turn (``param_version_start`` ..
``param_version_end``: the staleness bound holds per episode, on its first token).

Budgets: ``env.max_turns`` policy turns of at most ``env.max_turn_tokens`` new tokens each (the wrapped
worker's ``max_turn_tokens`` knob: exact across interruptions, counted from ``Sample.turn_start``); the
episode's tokens, the environment's included, within
``rollout.max_new_tokens`` (a message that would not fit ends the episode, counted in
``env/truncated``). An environment that raises ends the episode unscored (``Sample.unscored``: left out
of the update) and counts in ``env/errors``; a step that does not answer within ``env.step_timeout_s``
does too (``env/timeouts``; ``rl_engine.bounded_call``). ``env/seconds``: the episode's time in the
environment.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from rl_engine.bounded_call import BoundedCall, CallTimeout
from rl_engine.envs.base import Environment, Episode
from rl_engine.envs.chat_turns import observation_ids
from rl_engine.types import UNSCORED, Prompt, Sample

log = logging.getLogger(__name__)

# sample.metadata[META] = {"spans": [[start, end], ...], "replies": [...], "roles": [...]}; once done,
# also "policy" (the policy's turns, decoded) and "final" (the last of them)
META = "env"
DONE = "env/done"
DEFAULT_STEP_TIMEOUT_S = 30.0
REWARD = "env/reward"


class EpisodeWorker:
    """A rollout worker whose samples are whole episodes (module docstring). Everything else — weights,
    interrupts, the tokenizer, the sampling config — is the wrapped worker's."""

    def __init__(
        self,
        worker: Any,
        env: Environment,
        *,
        max_turns: int,
        max_tokens: int,
        max_turn_tokens: int | None = None,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
    ):
        # the worker caps each turn (rl_engine.rollout.common.call_budget)
        worker.max_turn_tokens = max_turn_tokens
        self._inner = worker
        self._env = env
        self._bounded = BoundedCall(step_timeout_s, "environment")  # each step in a thread, time-limited
        self._max_turns = max_turns
        self._max_tokens = max_tokens
        attach = getattr(env, "attach", None)
        if attach is not None:  # an environment that renders messages itself (an agent's first call)
            attach(worker.tokenizer)

    # the wrapped worker's attributes (version, interrupt, update_weights, tokenizer, ...), read through
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet (e.g. while unpickling): never the wrapped worker's
            raise AttributeError(name)
        return getattr(self._inner, name)

    @property
    def cfg(self) -> Any:
        """The wrapped worker's rollout config, read and written (the evaluator swaps it for its own
        sampling settings while it holds the worker: ``rl_engine.evaluation.sampling_overrides``)."""
        return self._inner.cfg

    @cfg.setter
    def cfg(self, value: Any) -> None:
        self._inner.cfg = value

    def generate(self, prompts: list[Prompt], n: int) -> list[Sample]:
        return self._play(self._inner.generate(prompts, n))

    def resume(self, samples: list[Sample]) -> list[Sample]:
        return self._play(self._inner.resume(samples))

    # --- episodes -------------------------------------------------------------------------------------
    def _play(self, samples: list[Sample]) -> list[Sample]:
        """Answer every finished policy turn; resume the episodes that go on, until each is done or the
        worker is interrupted (its unfinished samples come back as ``abort``, continued by ``resume``)."""
        samples = list(samples)
        while True:
            todo = []
            for i, s in enumerate(samples):
                if s.loss_mask is not None and len(s.loss_mask) < len(s.response_ids):
                    # the wrapped worker appended sampled tokens: they are trained on
                    s.loss_mask = s.loss_mask + [1] * (len(s.response_ids) - len(s.loss_mask))
                if s.finish_reason != "abort" and not s.extra.get(DONE):
                    samples[i] = self._answer(s)
                if samples[i].finish_reason == "abort":
                    todo.append(i)
            if not todo or getattr(self._inner, "interrupted", False):
                return samples
            for i, s in zip(todo, self._inner.resume([samples[i] for i in todo]), strict=True):
                samples[i] = s

    def _answer(self, s: Sample) -> Sample:
        """The environment's step after ``s``'s last policy turn: the episode ends (marked done, its
        reward and figures kept) or the message's tokens are appended and the sample continues."""
        state = s.metadata.get(META) or {"spans": [], "replies": []}
        if "id" not in state:  # the episode's name, kept in the sample with the rest of the episode
            state = {**state, "id": uuid.uuid4().hex}
            s.metadata = {**s.metadata, META: state}
        episode = self.episode(s)
        try:
            t0 = time.monotonic()
            step = self._bounded(self._env.step, episode)
            seconds = time.monotonic() - t0
        except CallTimeout as exc:  # a hung environment ends the episode, unscored
            log.warning("environment step on %s: %s", s.prompt_uid, exc)
            return self._finish(s, episode, errors=1.0, timeouts=1.0, unscored=True)
        except Exception as exc:  # an environment's failure ends the episode, unscored (never a 0)
            log.warning("environment failed on %s: %s: %s", s.prompt_uid, type(exc).__name__, exc)
            return self._finish(s, episode, errors=1.0, unscored=True)
        s.extra["env/seconds"] = s.extra.get("env/seconds", 0.0) + seconds
        if step.done:
            return self._finish(s, episode, reward=step.reward, figures=step.figures)
        if episode.turn >= self._max_turns:
            return self._finish(s, episode, figures=step.figures, truncated=1.0)
        ids = observation_ids(
            self.tokenizer, step.message, step.role, policy_stopped=s.finish_reason == "stop"
        )
        start = len(s.response_ids)
        if start + len(ids) >= self._max_tokens:  # no room for the message and one more token
            return self._finish(s, episode, figures=step.figures, truncated=1.0)
        mask = s.loss_mask if s.loss_mask is not None else [1] * start
        s.metadata = {
            **s.metadata,
            META: {
                "id": state["id"],
                "spans": [*state["spans"], [start, start + len(ids)]],
                "replies": [*state["replies"], step.message],
                "roles": [*state.get("roles", ()), step.role],
            },
        }
        s.response_ids = s.response_ids + ids
        s.logprobs = s.logprobs + [0.0] * len(ids)
        s.loss_mask = mask + [0] * len(ids)
        s.turn_start = len(s.response_ids)  # the next policy turn begins after the message
        s.finish_reason = "abort"  # the next turn: the wrapped worker's resume continues from these ids
        return s

    def episode(self, s: Sample) -> Episode:
        """The episode ``s`` holds: its policy turns decoded from the sampled ids between the spans the
        environment wrote (never the environment's tokens), and the environment's messages."""
        state = s.metadata.get(META) or {"spans": [], "replies": []}
        turns, cursor = [], 0
        for start, end in state["spans"]:
            turns.append(s.response_ids[cursor:start])
            cursor = end
        turns.append(s.response_ids[cursor:])
        texts = tuple(self.tokenizer.decode(t, skip_special_tokens=True) for t in turns)
        metadata = {k: v for k, v in s.metadata.items() if k != META}
        return Episode(s.prompt_text, s.answer, metadata, texts, tuple(state["replies"]), state.get("id", ""))

    def _finish(
        self,
        s: Sample,
        episode: Episode,
        *,
        reward: float | None = None,
        figures: dict[str, float] | None = None,
        truncated: float = 0.0,
        errors: float = 0.0,
        timeouts: float = 0.0,
        unscored: bool = False,
    ) -> Sample:
        s.extra[DONE] = 1.0
        state = {**(s.metadata.get(META) or {}), "policy": list(episode.policy), "final": episode.policy[-1]}
        s.metadata = {**s.metadata, META: state}
        s.extra["env/turns"] = float(episode.turn)
        s.extra["env/truncated"] = truncated
        s.extra["env/errors"] = errors
        s.extra["env/timeouts"] = timeouts
        s.extra.setdefault("env/seconds", 0.0)
        for key, value in (figures or {}).items():
            s.extra[f"env/{key}"] = float(value)
        if reward is not None:
            s.extra[REWARD] = float(reward)
        if unscored:
            s.extra[UNSCORED] = 1.0
        return s

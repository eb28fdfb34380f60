"""What the vLLM and SGLang workers share: a rollout worker over an asyncio engine.

The engine lives on the worker's own :class:`~rl_engine.rollout.engine_loop.EngineLoop` (built inside
a coroutine there, every call a coroutine submitted to it, every wait bounded); a call's samples go to
it as concurrent requests, which the engine batches continuously; interrupts go through an
:class:`~rl_engine.rollout.engine_loop.InterruptGate` (docs/engine.md, "GPU backends: the interrupt
protocol"). A backend supplies its engine's keywords and constructor, one request, its abort / resume
coroutines and its weight calls.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from abc import abstractmethod
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from rl_engine.config import EngineRolloutConfig, ModelConfig
from rl_engine.rollout.base import RolloutWorker
from rl_engine.rollout.common import (
    call_budget,
    eos_floor,
    extend_sample,
    needs_continuation,
    sample_template,
)
from rl_engine.rollout.engine_loop import EngineLoop, InterruptGate
from rl_engine.types import FinishReason, Prompt, Sample

Result = tuple[list[int], list[float], FinishReason]  # one response: token ids, log-probs, finish
T = TypeVar("T")


@dataclass(frozen=True)
class EngineRequest:
    """One response's request to the engine: prompt + the response so far, at most ``max_tokens`` new
    tokens, eos masked out for the first ``min_tokens`` of them (``RolloutWorker.min_new_tokens``)."""

    token_ids: list[int]
    max_tokens: int
    min_tokens: int = 0


class AsyncEngineWorker(RolloutWorker):
    """A rollout worker whose engine is an asyncio program driven from the worker's own loop thread."""

    backend: ClassVar[str]  # the engine's name in errors and the loop thread's name
    supports_concurrent_calls = True  # the engine batches concurrent requests continuously

    def __init__(self, rollout_cfg: EngineRolloutConfig, model_cfg: ModelConfig, *, seed: int = 0):
        super().__init__()
        from rl_engine.models import ensure_model, load_tokenizer, special_token_ids, torch_dtype

        self.cfg = rollout_cfg
        path = ensure_model(model_cfg)
        self.tokenizer = load_tokenizer(model_cfg)
        self.special = special_token_ids(model_cfg, self.tokenizer)
        self._dtype = torch_dtype(model_cfg)  # what the engine serves: named tensors are cast to it
        self._request_ids = itertools.count()
        self._loop = EngineLoop(self.backend)
        kwargs = self.engine_kwargs(model_cfg, str(path), seed)
        self.engine = self._loop.call(
            self._build(kwargs), timeout=rollout_cfg.startup_timeout_s, what="engine start"
        )
        self._gate = InterruptGate(
            self._loop,
            pause=self._pause,
            resume=self._resume,
            flag=self._interrupt,
            timeout_s=rollout_cfg.control_timeout_s,
        )

    # --- what a backend supplies ------------------------------------------------------------------------
    @abstractmethod
    def engine_kwargs(self, model_cfg: ModelConfig, path: str, seed: int) -> dict[str, Any]:
        """The engine constructor's keywords for the model at ``path``."""

    @abstractmethod
    async def _build(self, kwargs: dict[str, Any]) -> Any:
        """Create the engine (runs on the loop thread, so the engine binds to that loop)."""

    @abstractmethod
    async def _one(self, req: EngineRequest) -> Result:
        """One request. It must return an empty ``abort`` without touching the engine when
        ``self.interrupted`` (checked on the loop thread)."""

    @abstractmethod
    def _pause(self) -> Coroutine[Any, Any, Any]:
        """The engine's abort-mode pause (in-flight requests return their partial output)."""

    @abstractmethod
    def _resume(self) -> Coroutine[Any, Any, Any]:
        """Undo :meth:`_pause`."""

    def _control(self, what: str, coro: Coroutine[Any, Any, T]) -> T:
        """Run an engine control call (pause, weights, cache), bounded by ``control_timeout_s``."""
        return self._loop.call(coro, timeout=self.cfg.control_timeout_s, what=what)

    # --- generation -------------------------------------------------------------------------------------
    async def _many(self, reqs: list[EngineRequest]) -> list[Result]:
        return list(await asyncio.gather(*(self._one(r) for r in reqs)))

    def _request(self, sample: Sample) -> EngineRequest:
        done = len(sample.response_ids)
        budget = call_budget(sample, self.cfg.max_new_tokens, self.max_turn_tokens)
        return EngineRequest(
            sample.prompt_ids + sample.response_ids, budget, eos_floor(self.min_new_tokens, done, budget)
        )

    def _run(self, samples: list[Sample]) -> list[Sample]:
        if not samples:
            return []
        t0, version = time.perf_counter(), self.version
        reqs = [self._request(s) for s in samples]
        results = self._loop.call(self._many(reqs), timeout=self.cfg.request_timeout_s, what="generate")
        dt = time.perf_counter() - t0
        return [
            extend_sample(s, ids, lps, fin, version=version, elapsed_s=dt, tokenizer=self.tokenizer)
            for s, (ids, lps, fin) in zip(samples, results, strict=True)
        ]

    def generate(self, prompts: list[Prompt], n: int) -> list[Sample]:
        return self._run([sample_template(p, self.version) for p in prompts for _ in range(n)])

    def resume(self, samples: list[Sample]) -> list[Sample]:
        todo = [
            i
            for i, s in enumerate(samples)
            if needs_continuation(s, self.cfg.max_new_tokens, self.max_turn_tokens)
        ]
        out = list(samples)
        for i, s in zip(todo, self._run([samples[i] for i in todo]), strict=True):
            out[i] = s
        return out

    # --- partial rollout --------------------------------------------------------------------------------
    def interrupt(self) -> None:
        """Never blocks: submits the abort-mode pause and returns (see engine_loop)."""
        self._gate.interrupt()

    def clear_interrupt(self) -> None:
        self._gate.clear()

    def close(self) -> None:
        try:
            self.engine.shutdown()
        finally:
            self._loop.close()

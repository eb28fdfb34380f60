"""Held-out evaluation: answer the validation prompts with a rollout worker's current weights, score the
responses with the run's reward, and report ``val/`` metrics.

One code path for every backend: the ``Evaluator`` only calls the worker contract (``generate``,
``resume``, ``version``) and changes the sampling settings the worker reads at each call (``worker.cfg``)
for the duration of one chunk, so greedy decoding is ``top_p`` → 0 (the nucleus keeps only the most
likely token, in the HF loop, vLLM and SGLang alike). The prompts go in chunks of
``eval.prompts_per_call``; the caller's ``hold`` context manager is entered around each chunk's
generation (not its scoring, which needs no worker), which is where a rollouter gives its worker to the
evaluation and takes it back between chunks (its training generation interleaves with the evaluation
instead of stopping for all of it, and a weight update may land between two chunks).

Metrics: ``val/reward_mean``, ``val/pass@k`` (k = 1 and n; unbiased estimator), ``val/response_length``
(mean tokens), ``val/truncated_ratio`` (hit max_new_tokens), ``val/aborted_ratio`` (interrupted and not
finished: normally 0), ``val/reward_errors`` (responses whose reward raised, scored 0),
``val/num_prompts``, ``val/param_version`` and ``val/param_version_end`` (the weights of the first and
of the last chunk: they differ when a weight update landed between chunks), ``val/time_s``; with a
weighted-sum reward (``reward.combine``) each component's mean, ``val/reward/<key>/mean``.

Each of ``data.extra_validation_splits`` (another held-out set: other wordings, harder problems) is
evaluated after the validation prompts, in the same call, on its own: its figures are the same names under
``val/<split>/`` (``val/transfer/pass@1``...), its chunks counted in the weight versions and the time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rl_engine.config import EvalConfig, ExperimentConfig
from rl_engine.rewards.base import component_means, score_samples
from rl_engine.types import EvalSummary, Prompt, Sample, split_groups

GREEDY_TOP_P = 1e-9  # below any second-best token's mass: only the argmax survives the nucleus cut
MAX_RESUMES = 8  # continuation attempts for responses interrupted mid-evaluation


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` responses drawn from ``n`` (``c`` of them correct) is
    correct: ``1 - C(n - c, k) / C(n, k)`` (the unbiased estimator of Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class EvalResult:
    """One evaluation: its figures (what a rollouter sends the driver) and the scored samples."""

    summary: EvalSummary
    samples: list[Sample] = field(repr=False)

    @property
    def metrics(self) -> dict[str, float]:
        """The ``val/`` metrics, by name."""
        return self.summary.metrics()


@contextlib.contextmanager
def sampling_overrides(worker: Any, **updates: Any) -> Iterator[None]:
    """Let ``worker`` sample with ``updates`` applied to its rollout config, then restore it. The
    caller must hold the worker exclusively meanwhile (no other generate call may run)."""
    original = worker.cfg
    worker.cfg = original.model_copy(update=updates)
    try:
        yield
    finally:
        worker.cfg = original


class Evaluator:
    """Evaluates a worker on fixed validation prompts; see the module docstring."""

    def __init__(
        self,
        eval_cfg: EvalConfig,
        prompts: list[Prompt],
        reward_fn: Callable[[Sample], float],
        *,
        rollout_temperature: float,
        extra_sets: dict[str, list[Prompt]] | None = None,
    ):
        if not prompts:
            raise ValueError("evaluation needs at least one validation prompt")
        self.cfg = eval_cfg
        self.prompts = list(prompts)
        self.extra_sets = {name: list(p) for name, p in (extra_sets or {}).items()}
        self.reward_fn = reward_fn
        self.temperature = eval_cfg.temperature or rollout_temperature

    @classmethod
    def from_config(
        cls, cfg: ExperimentConfig, tokenizer: Any, reward_fn: Callable[[Sample], float] | None = None
    ) -> Evaluator | None:
        """The run's evaluator (validation prompts of ``cfg.data``, the run's reward), or None when
        evaluation is off."""
        if not cfg.eval.enabled:
            return None
        from rl_engine.data import extra_validation_prompts, validation_prompts

        if reward_fn is None:
            from rl_engine.rewards import build_reward

            reward_fn = build_reward(cfg.reward)
        prompts = validation_prompts(cfg, tokenizer, cfg.eval.max_prompts)
        extra = extra_validation_prompts(cfg, tokenizer, cfg.eval.max_prompts)
        return cls(
            cfg.eval, prompts, reward_fn, rollout_temperature=cfg.rollout.temperature, extra_sets=extra
        )

    def chunks(self, prompts: list[Prompt] | None = None) -> list[list[Prompt]]:
        """``prompts`` (default: the validation prompts) in generate calls of ``eval.prompts_per_call``."""
        prompts = self.prompts if prompts is None else prompts
        k = self.cfg.prompts_per_call
        return [prompts[i : i + k] for i in range(0, len(prompts), k)]

    def _overrides(self) -> dict[str, Any]:
        if self.cfg.greedy:
            return {"top_p": GREEDY_TOP_P}
        return {"temperature": self.temperature, "top_p": 1.0}

    def generate(self, worker: Any, prompts: list[Prompt]) -> list[Sample]:
        """Answer ``prompts`` ``eval.n`` times each (continuing interrupted responses) and score them."""
        return self.score(self.answer(worker, prompts))

    def answer(self, worker: Any, prompts: list[Prompt]) -> list[Sample]:
        """Answer ``prompts`` ``eval.n`` times each, continuing interrupted responses (unscored)."""
        with sampling_overrides(worker, **self._overrides()):
            samples = worker.generate(prompts, self.cfg.n)
            for _ in range(MAX_RESUMES):
                todo = [i for i, s in enumerate(samples) if s.finish_reason == "abort"]
                if not todo or worker.interrupted:
                    break
                for i, s in zip(todo, worker.resume([samples[i] for i in todo]), strict=True):
                    samples[i] = s
        return samples

    def score(self, samples: list[Sample]) -> list[Sample]:
        """Score ``samples`` in one call (``score_samples``): a sample a remote reward service left
        unscored counts 0 here and is counted in ``val/reward_errors``."""
        score_samples(self.reward_fn, samples)
        return samples

    def run(
        self, worker: Any, *, hold: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    ) -> EvalResult:
        """Evaluate every validation prompt, then each extra split's; ``hold()`` is entered around each
        chunk's generation. The result's samples are the validation prompts' (the extra splits' figures are
        in its summary's ``sets``)."""
        t0 = time.monotonic()
        versions: list[int] = []
        answered: dict[str, list[Sample]] = {}
        for name, prompts in {"": self.prompts, **self.extra_sets}.items():
            answered[name] = []
            for chunk in self.chunks(prompts):
                with hold() if hold is not None else contextlib.nullcontext():
                    versions.append(int(worker.version))
                    samples = self.answer(worker, chunk)
                answered[name].extend(self.score(samples))  # the worker is free meanwhile
        took = time.monotonic() - t0
        sets = {name: self.summarize(answered[name], versions, took) for name in self.extra_sets}
        summary = dataclasses.replace(self.summarize(answered[""], versions, took), sets=sets)
        return EvalResult(summary, answered[""])

    def summarize(self, samples: list[Sample], versions: list[int], time_s: float) -> EvalSummary:
        """Aggregate scored samples (grouped by prompt, ``eval.n`` each) answered with weights
        ``versions`` (one per chunk) in ``time_s`` seconds."""
        groups = split_groups(samples)
        n = self.cfg.n
        threshold = self.cfg.success_threshold
        pass_at = {
            k: statistics.fmean(pass_at_k(len(g), sum(s.reward >= threshold for s in g), k) for g in groups)
            for k in sorted({1, n})
        }
        return EvalSummary(
            reward_mean=statistics.fmean(s.reward for s in samples),
            response_length=statistics.fmean(s.response_length for s in samples),
            truncated_ratio=statistics.fmean(s.finish_reason == "length" for s in samples),
            aborted_ratio=statistics.fmean(s.finish_reason == "abort" for s in samples),
            reward_errors=sum(bool(s.extra.get("reward_error")) or s.unscored for s in samples),
            num_prompts=len(groups),
            n=n,
            pass_at_1=pass_at[1],
            pass_at_n=pass_at[n],
            param_version=versions[0],
            param_version_end=versions[-1],
            time_s=time_s,
            reward_parts=component_means([s.extra for s in samples]),
        )


__all__ = ["GREEDY_TOP_P", "EvalResult", "EvalSummary", "Evaluator", "pass_at_k", "sampling_overrides"]

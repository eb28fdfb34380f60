"""The reward contract: ``RewardFn(sample) -> float``, and ``SafeReward``, the wrapper every reward runs
in (a reward that raises, returns NaN, or (a plugin) hangs past its timeout scores 0 for that sample, is
counted and logged, and never stops the rollout).

A reward may also score a whole batch at once (:class:`BatchRewardFn`: the remote reward service,
``rl_engine.rewards.remote``), and may then leave a sample **unscored** (``None``: the service could not
be reached, or answered nothing for it). An unscored sample is never a silent 0: it is marked
(``sample.extra[UNSCORED] = 1``), counted (``reward/unscored``), left out of the update (the trainer
gives it no advantage and no loss) and of the step's ``reward/mean``. Callers score through
:func:`score_samples`, one code path for both kinds."""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from rl_engine.bounded_call import MAX_HANGS, BoundedCall
from rl_engine.types import UNSCORED, Sample

log = logging.getLogger(__name__)

RewardFn = Callable[[Sample], float]


class BatchRewardFn(Protocol):
    """A reward that scores many samples in one call: one result per sample, in order, each a score, a
    mapping with ``score`` (and named figures, as a plugin's), or ``None`` for a sample it could not
    score. It must not raise for one bad sample (a raise leaves the whole batch unscored)."""

    def score_batch(self, samples: Sequence[Sample], /) -> list[Any]: ...


def score_samples(reward_fn: Callable[[Sample], float], samples: Sequence[Sample]) -> None:
    """Set each sample's ``reward`` with ``reward_fn``: in one ``score_batch`` call where it has one
    (``SafeReward``, ``WeightedSum``), else sample by sample. An unscored sample gets 0.0 and the mark."""
    batch = getattr(reward_fn, "score_batch", None)
    if batch is None:
        for s in samples:
            s.reward = float(reward_fn(s))
        return
    for s, value in zip(samples, batch(samples), strict=True):
        if value is None:
            s.extra[UNSCORED] = 1.0
            s.reward = 0.0
        else:
            s.reward = float(value)


# A plugin's per-call limit when the config sets none (``reward.timeout_s``); how many calls may be left
# hanging before the reward is closed is rl_engine.bounded_call's MAX_HANGS.
DEFAULT_TIMEOUT_S = 10.0
# A figure's name in a reward's mapping result, as a component's label (metric reward/<name>/<figure>/mean).
FIGURE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
MAX_FIGURES = 32


class SafeReward:
    """A reward function that cannot crash (or, with ``timeout_s``, stall) its caller.

    An exception (or a non-finite value, or a malformed mapping) scores ``error_value`` for that sample,
    marks it (``sample.extra["reward_error"] = 1``), counts it (``errors``, also in ``stats()``) and logs
    it: the first ``log_first`` errors in full, then every ``log_every``-th, so a reward that fails on
    every sample cannot flood the log.

    The function may return a mapping instead of a float: ``score`` is the score, every other key a
    figure (a finite float) kept on the sample as ``sample.extra["reward/<name>/<figure>"]`` (the step
    metric ``reward/<name>/<figure>/mean``).

    With ``timeout_s`` (reward plugins: the operator's code) each call runs in a daemon thread and the
    caller waits at most that long: a call that has not answered scores as an error (``timeouts``). Python
    cannot kill a thread, so the hung call is abandoned, still running; after ``max_hangs`` of them the
    reward is closed: it is not called again and every later sample scores as an error, so hung threads
    stay bounded and the rollouter goes on (at ``error_value``, loudly logged).
    """

    def __init__(
        self,
        fn: Callable[[Sample], Any],
        name: str,
        *,
        error_value: float = 0.0,
        log_first: int = 5,
        log_every: int = 100,
        timeout_s: float | None = None,
        max_hangs: int = MAX_HANGS,
    ):
        self.fn, self.name, self.error_value = fn, name, error_value
        self.log_first, self.log_every = log_first, log_every
        self.timeout_s, self.max_hangs = timeout_s, max_hangs
        self.calls = 0
        self.errors = 0
        self.unscored = 0  # samples a batch function left without a score (``score_batch``)
        # with a time limit, each call runs in a thread of its own (rl_engine.bounded_call)
        self._bounded = (
            BoundedCall(timeout_s, f"reward {name!r}", max_hangs) if timeout_s is not None else None
        )
        self._lock = threading.Lock()  # rollouters may score from several threads

    def __call__(self, sample: Sample) -> float:
        with self._lock:
            self.calls += 1
        return self._checked(sample, lambda: self._call(sample))

    def score_batch(self, samples: Sequence[Sample]) -> list[float | None]:
        """Score ``samples``: in one call of the function's own ``score_batch`` where it has one (each
        result checked as a single call's; ``None``: unscored, counted in ``unscored``; a raise or a
        wrong number of results: the whole batch unscored), else one call per sample."""
        batch = getattr(self.fn, "score_batch", None)
        if batch is None:
            return [self(s) for s in samples]
        with self._lock:
            self.calls += len(samples)
        try:
            results = list(batch(samples))
            if len(results) != len(samples):
                raise ValueError(f"returned {len(results)} results for {len(samples)} samples")
        except Exception as exc:  # the batch function's own failure: nothing of it is a score
            log.warning(
                "reward %r left %d samples unscored: %s: %s",
                self.name,
                len(samples),
                type(exc).__name__,
                str(exc)[:300],
            )
            results = [None] * len(samples)
        out: list[float | None] = []
        for s, result in zip(samples, results, strict=True):
            if result is None:
                with self._lock:
                    self.unscored += 1
                out.append(None)
            else:
                out.append(self._checked(s, lambda r=result: r))
        return out

    def _call(self, sample: Sample) -> Any:
        return self.fn(sample) if self._bounded is None else self._bounded(self.fn, sample)

    @property
    def timeouts(self) -> int:
        """Calls cut off by ``timeout_s`` (abandoned, still running)."""
        return self._bounded.hangs if self._bounded is not None else 0

    @property
    def closed(self) -> bool:
        """Closed after ``max_hangs`` cut-off calls: every later sample scores as an error at once."""
        return self._bounded is not None and self._bounded.closed

    def _checked(self, sample: Sample, compute: Callable[[], Any]) -> float:
        """``compute()``'s score, its figures kept on the sample; an exception or a malformed result
        scores ``error_value`` and marks, counts and logs the sample as an error."""
        try:
            value, figures = self._value(compute())
            for figure, number in figures.items():
                sample.extra[f"{COMPONENT_PREFIX}{self.name}/{figure}"] = number
            return value
        except Exception as exc:
            with self._lock:
                self.errors += 1
                n = self.errors
            if n <= self.log_first or n % self.log_every == 0:
                log.warning(
                    "reward %r failed on prompt %s (%d failures so far, scored %s): %s: %s",
                    self.name,
                    sample.prompt_uid,
                    n,
                    self.error_value,
                    type(exc).__name__,
                    exc,
                )
            sample.extra["reward_error"] = 1.0
            return self.error_value

    @staticmethod
    def _value(result: Any) -> tuple[float, dict[str, float]]:
        """(score, figures) of a result: a number, or a mapping with ``score`` and named figures."""
        figures: dict[str, float] = {}
        if isinstance(result, Mapping):
            if "score" not in result:
                raise ValueError(
                    f"returned a mapping without 'score' (keys: {', '.join(map(str, result))[:200]})"
                )
            if len(result) - 1 > MAX_FIGURES:
                raise ValueError(f"returned {len(result) - 1} figures (at most {MAX_FIGURES})")
            for key, raw in result.items():
                if key == "score":
                    continue
                if not isinstance(key, str) or not FIGURE_NAME.match(key):
                    raise ValueError(f"figure name {str(key)[:80]!r}: letters, digits, _ . - (at most 64)")
                number = float(raw)
                if not math.isfinite(number):
                    raise ValueError(f"figure {key!r} is {number}")
                figures[key] = number
            result = result["score"]
        value = float(result)
        if not math.isfinite(value):
            raise ValueError(f"returned {value}")
        return value, figures

    def stats(self) -> dict[str, float]:
        """Cumulative counts for the step metrics (``reward/timeouts`` where calls have a time limit)."""
        out = {
            "reward/errors": float(self.errors),
            "reward/calls": float(self.calls),
            "reward/unscored": float(self.unscored),
        }
        if self.timeout_s is not None:
            out["reward/timeouts"] = float(self.timeouts)
        return out


# The prefix of a component's score in ``Sample.extra`` (and of its metric, ``reward/<key>/mean``).
COMPONENT_PREFIX = "reward/"


class WeightedSum:
    """The reward of ``reward.combine``: ``sum(weight * score)`` of its components, each run in its own
    ``SafeReward`` (a component that fails scores 0 and marks the sample; the others still count).

    Each component's score is kept on the sample (``sample.extra["reward/<key>"]``): the trainer's step
    metrics average it (``reward/<key>/mean``) beside the total's ``reward/mean``."""

    def __init__(self, parts: list[tuple[str, float, SafeReward]]):
        if not parts:
            raise ValueError("a weighted sum needs at least one reward")
        self.parts = parts
        self.name = "+".join(key for key, _, _ in parts)
        self.calls = 0
        self.unscored = 0
        self._lock = threading.Lock()

    def __call__(self, sample: Sample) -> float:
        total = self.score_batch([sample])[0]
        if total is None:  # only a batch component leaves a sample unscored
            raise RuntimeError(f"reward {self.name!r}: a component left the sample unscored")
        return total

    def score_batch(self, samples: Sequence[Sample]) -> list[float | None]:
        """Each component scores the whole batch (``SafeReward.score_batch``); a sample any component
        left unscored is unscored (``None``, counted in ``unscored``), the others get the weighted sum."""
        with self._lock:
            self.calls += len(samples)
        totals: list[float | None] = [0.0] * len(samples)
        for key, weight, fn in self.parts:
            for i, (s, score) in enumerate(zip(samples, fn.score_batch(samples), strict=True)):
                total = totals[i]
                if score is None or total is None:
                    totals[i] = None
                    continue
                s.extra[f"{COMPONENT_PREFIX}{key}"] = score
                totals[i] = total + weight * score
        with self._lock:
            self.unscored += sum(t is None for t in totals)
        return totals

    @property
    def errors(self) -> int:
        return sum(fn.errors for _, _, fn in self.parts)

    def stats(self) -> dict[str, float]:
        """``reward/errors``: failed component calls (all components); ``reward/calls``: samples scored;
        ``reward/unscored``: samples left without a total (a component could not score them);
        ``reward/timeouts``: calls of plugin components cut off (where a component has a time limit)."""
        out = {
            "reward/errors": float(self.errors),
            "reward/calls": float(self.calls),
            "reward/unscored": float(self.unscored),
        }
        if any(fn.timeout_s is not None for _, _, fn in self.parts):
            out["reward/timeouts"] = float(sum(fn.timeouts for _, _, fn in self.parts))
        return out


def component_means(extras: list[dict[str, float]], prefix: str = COMPONENT_PREFIX) -> dict[str, float]:
    """``{"reward/<key>/mean": mean}`` over the samples' component scores (``WeightedSum``); a sample
    without a key (none, unless the batch mixes rewards) is left out of that key's mean. Another
    ``prefix`` averages other per-sample figures the same way (an episode's ``env/<figure>``)."""
    sums: dict[str, list[float]] = {}
    for extra in extras:
        for key, value in extra.items():
            if key.startswith(prefix):
                acc = sums.setdefault(key, [0.0, 0.0])
                acc[0] += float(value)
                acc[1] += 1.0
    return {f"{key}/mean": total / count for key, (total, count) in sorted(sums.items())}


# What a sample carries to the platform of its components (``wire.SampleIn.reward_parts``'s bounds).
MAX_SAMPLE_PARTS = 32
MAX_PART_LABEL = 200


def sample_parts(extra: dict[str, Any]) -> dict[str, float] | None:
    """A sample's component scores by label (``extra["reward/<label>"]`` -> ``<label>``), for its example
    (``ExampleSample.reward_parts``): finite ones with labels of at most ``MAX_PART_LABEL`` characters,
    the first ``MAX_SAMPLE_PARTS`` in label order; None when it has none."""
    parts: dict[str, float] = {}
    for key in sorted(extra):
        label = key[len(COMPONENT_PREFIX) :]
        if not key.startswith(COMPONENT_PREFIX) or not label or len(label) > MAX_PART_LABEL:
            continue
        try:
            value = float(extra[key])
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and len(parts) < MAX_SAMPLE_PARTS:
            parts[label] = value
    return parts or None

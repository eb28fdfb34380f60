"""Per-step metrics with stable, namespaced names (listed in docs/pipeline.md, "Metrics"), computed from
one trainer step's result."""

from __future__ import annotations

import statistics

from rl_engine.types import QueueStats, StepResult


def step_metrics(
    result: StepResult,
    *,
    step_wall_s: float,
    sync_s: float | None,
    queue_stats: QueueStats,
    rollout_busy_delta_s: list[float],
    gen_window_s: float,
    counters: dict[str, float] | None = None,
) -> dict[str, float]:
    """Merge the trainer's own metrics with pipeline figures for one step.

    ``rollout_busy_delta_s``: per rollouter, seconds spent inside worker calls since the last step;
    ``gen_window_s``: wall seconds of that window (so idle ratio = 1 - busy / window);
    ``counters``: the rollouters' cumulative counters (``sum_counters``), merged as they are.
    """
    lengths, stal = result.lengths, result.staleness
    unscored = result.unscored or [False] * len(result.rewards)
    # an unscored sample (a remote reward service failed it) has no reward: left out of the figures
    rewards = [r for r, u in zip(result.rewards, unscored, strict=True) if not u]
    m: dict[str, float] = {k: float(v) for k, v in result.trainer_metrics.items()}
    busy_window = max(gen_window_s, 1e-9)
    m.update(
        {
            "reward/unscored_ratio": sum(unscored) / max(len(unscored), 1),
            "response_length/mean": statistics.fmean(lengths),
            "timing/gen_s": statistics.fmean(rollout_busy_delta_s) if rollout_busy_delta_s else 0.0,
            "timing/train_s": result.train_s,
            "timing/wait_s": result.wait_s,
            "timing/step_s": step_wall_s,
            "async/staleness_mean": statistics.fmean(stal),
            "async/staleness_max": float(max(stal)),
            "async/queue_size": float(queue_stats.queued),
            "async/partial_ratio": sum(result.partial) / len(result.partial),
            "async/dropped_stale": float(queue_stats.dropped_stale),
            "async/param_version": float(result.version),
            "trainer/idle_ratio": result.wait_s / max(step_wall_s, 1e-9),
            "rollouter/idle_ratio": 1.0 - min(1.0, statistics.fmean(rollout_busy_delta_s) / busy_window)
            if rollout_busy_delta_s
            else 0.0,
            "throughput/tokens_per_s": sum(lengths) / max(step_wall_s, 1e-9),
            "throughput/samples_per_s": len(lengths) / max(step_wall_s, 1e-9),
        }
    )
    if rewards:  # none when every sample of the step is unscored
        m["reward/mean"] = statistics.fmean(rewards)
        m["reward/std"] = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
    m.update(result.reward_parts)  # reward/<key>/mean of each component of a weighted sum
    if sync_s is not None:
        m["timing/weight_sync_s"] = sync_s
    m.update(counters or {})
    return m


def sum_counters(per_rollouter: list[dict[str, float]]) -> dict[str, float]:
    """One run's counters from each rollouter's ``Rollouter.counters()``, key by key: the reward's
    (``reward/errors``, ``reward/calls``) add up; the data stream's come from rollouter 0 alone."""
    out: dict[str, float] = {}
    for counters in per_rollouter:
        for key, value in counters.items():
            out[key] = out.get(key, 0.0) + float(value)
    return out

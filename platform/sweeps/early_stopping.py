"""Early stopping of a sweep's clearly losing runs by the median rule (the ``sweeps.early_stop`` beat
task, every ``SWEEP_EARLY_STOP_INTERVAL_S``).

For a running run ``r`` of a sweep that asked for it, at ``r``'s latest step ``s`` of the sweep's metric
(``s >= min_steps``): ``r``'s best value up to ``s`` (by the goal) is compared with the median of the
other runs' best values up to ``s``, over the other runs whose metric reached ``s`` (finished, stopped
or running; at least ``min_runs`` of them). Strictly worse: ``r`` is stopped (recorded on its sweep
entry and as a run event, then cancelled: sweeps.services.sweep_run_stop_early). :func:`median_rule`
is the pure rule; :func:`sweeps_early_stop` reads the series and applies it.

The values are reports (a run's job, or any member of its project, posts them), so what they can decide
is bounded: only the runs of the same sweep are compared (one project's, whose members may cancel them
anyway), and a non-finite value (which the ingestion wire refuses; a row written around it) is left out,
so that no single report can put the median at infinity.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from experiments.models import RunState
from sweeps.models import Goal, Sweep, SweepRun
from sweeps.services import EarlyStopping, sweep_run_stop_early
from tracking.models import MetricPoint

Series = Sequence[tuple[int, float]]  # (step, value), steps ascending


@dataclass(frozen=True)
class Verdict:
    run_id: int
    step: int
    value: float  # the run's best up to ``step``
    median: float  # of the others' best up to ``step``
    others: int

    def reason(self, metric: str, goal: str) -> str:
        return (
            f"median rule: best {metric} up to step {self.step} is {self.value:.6g}, worse (goal {goal}) than "
            f"the median {self.median:.6g} of {self.others} other runs at that step"
        )


def _best_upto(series: Series, step: int, goal: str) -> float | None:
    values = [v for s, v in series if s <= step]
    if not values:
        return None
    return max(values) if goal == Goal.MAX else min(values)


def median_rule(
    series: Mapping[int, Series], candidates: Sequence[int], *, goal: str, rule: EarlyStopping
) -> list[Verdict]:
    """The candidates (running runs) the median rule stops, given every run's series of the metric
    (non-finite values left out)."""
    series = {run: [(s, v) for s, v in points if math.isfinite(v)] for run, points in series.items()}
    out: list[Verdict] = []
    for run_id in candidates:
        own = series.get(run_id) or []
        if not own:
            continue
        step = own[-1][0]
        if step < rule.min_steps:
            continue
        mine = _best_upto(own, step, goal)
        others = [
            best
            for other, points in series.items()
            if other != run_id and points and points[-1][0] >= step
            if (best := _best_upto(points, step, goal)) is not None
        ]
        if mine is None or len(others) < rule.min_runs:
            continue
        median = statistics.median(others)
        if (mine < median) if goal == Goal.MAX else (mine > median):
            out.append(Verdict(run_id, step, mine, median, len(others)))
    return out


def _series(run_ids: list[int], metric: str) -> dict[int, list[tuple[int, float]]]:
    out: dict[int, list[tuple[int, float]]] = {r: [] for r in run_ids}
    rows = (
        MetricPoint.objects.filter(run_id__in=run_ids, key=metric)
        .order_by("run_id", "step")
        .values_list("run_id", "step", "value")
    )
    for run_id, step, value in rows.iterator(chunk_size=5000):
        out[run_id].append((step, value))
    return out


def sweep_early_stop(sweep: Sweep) -> list[int]:
    """Apply the median rule to one sweep's running runs; the ids of the runs it stopped."""
    rule = EarlyStopping.from_json(sweep.early_stopping)
    if rule is None:
        return []
    members = {m.run_id: m for m in SweepRun.objects.filter(sweep=sweep).select_related("run", "sweep")}
    candidates = [
        r for r, m in members.items() if m.run.state == RunState.RUNNING and m.early_stopped_at is None
    ]
    if not candidates:
        return []
    stopped = []
    for verdict in median_rule(_series(list(members), sweep.metric), candidates, goal=sweep.goal, rule=rule):
        if sweep_run_stop_early(
            member=members[verdict.run_id], reason=verdict.reason(sweep.metric, sweep.goal)
        ):
            stopped.append(verdict.run_id)
    return stopped


def sweeps_early_stop() -> list[int]:
    """Every sweep with early stopping and a running run; the ids of the runs stopped."""
    sweeps = Sweep.objects.filter(
        early_stopping__isnull=False, cancelled_at=None, members__run__state=RunState.RUNNING
    ).distinct()
    return [run_id for sweep in sweeps for run_id in sweep_early_stop(sweep)]

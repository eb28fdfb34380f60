"""Reads of the sweeps app: what a user may see, a sweep's derived state, and its runs ranked by the
sweep's metric (last or best value)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Max, Min, OuterRef, QuerySet, Subquery
from django.http import HttpRequest

from accounts.access import visible_project_ids
from experiments.models import ACTIVE_STATES, RunState
from sweeps.models import Goal, Summary, Sweep, SweepRun
from tracking.models import MetricPoint


def visible_sweeps(request: HttpRequest) -> QuerySet[Sweep]:
    return Sweep.objects.filter(project_id__in=visible_project_ids(request)).select_related(
        "experiment", "created_by"
    )


@dataclass(frozen=True)
class SweepProgress:
    state: str  # queued | running | cancelling | cancelled | finished
    counts: dict[str, int]  # run state -> number of the sweep's runs in it
    early_stopped: int


def sweep_state(cancelled: bool, counts: dict[str, int]) -> str:
    """The sweep's state from its runs' states and whether it was cancelled."""
    active = sum(n for s, n in counts.items() if s in ACTIVE_STATES)
    if active:
        if cancelled:
            return "cancelling"
        return "queued" if counts.get(RunState.QUEUED, 0) == sum(counts.values()) else "running"
    return "cancelled" if cancelled else "finished"


def sweep_progress(sweep: Sweep) -> SweepProgress:
    rows = SweepRun.objects.filter(sweep=sweep).values_list("run__state").annotate(n=Count("id"))
    counts = {state: n for state, n in rows}
    stopped = SweepRun.objects.filter(sweep=sweep, early_stopped_at__isnull=False).count()
    return SweepProgress(sweep_state(sweep.cancelled_at is not None, counts), counts, stopped)


@dataclass(frozen=True)
class RankedRun:
    run_id: int
    number: int
    state: str
    index: int
    params: dict[str, Any]
    seed: int
    last: float | None
    last_step: int | None
    best: float | None
    value: float | None  # by the summary asked for
    rank: int | None  # 1 = best; None: no value yet
    early_stopped_at: datetime | None
    early_stop_reason: str


def metric_summaries(run_ids: list[int], metric: str, goal: str) -> dict[int, tuple[float, int, float]]:
    """run id -> (last value, its step, best value by ``goal``), for the runs that stored the metric."""
    best_of = Max if goal == Goal.MAX else Min
    last = (
        MetricPoint.objects.filter(run_id=OuterRef("run_id"), key=metric)
        .order_by("-step")
        .values("value")[:1]
    )
    rows = (
        MetricPoint.objects.filter(run_id__in=run_ids, key=metric)
        .values("run_id")
        .annotate(best=best_of("value"), last_step=Max("step"), last=Subquery(last))
    )
    return {row["run_id"]: (row["last"], row["last_step"], row["best"]) for row in rows}


def sweep_runs_ranked(sweep: Sweep, summary: str | None = None) -> list[RankedRun]:
    """The sweep's runs, best first by ``summary`` (the sweep's own by default) of its metric in its
    goal's direction; runs without a value yet last, in index order."""
    summary = summary or sweep.summary
    members = list(SweepRun.objects.filter(sweep=sweep).select_related("run").order_by("index"))
    values = metric_summaries([m.run_id for m in members], sweep.metric, sweep.goal)
    sign = -1.0 if sweep.goal == Goal.MAX else 1.0

    def value_of(m: SweepRun) -> float | None:
        got = values.get(m.run_id)
        if got is None:
            return None
        return got[2] if summary == Summary.BEST else got[0]

    ordered = sorted(members, key=lambda m: (value_of(m) is None, sign * (value_of(m) or 0.0), m.index))
    out: list[RankedRun] = []
    for position, m in enumerate(ordered, start=1):
        got = values.get(m.run_id)
        value = value_of(m)
        out.append(
            RankedRun(
                run_id=m.run_id,
                number=m.run.number,
                state=m.run.state,
                index=m.index,
                params=m.params,
                seed=m.seed,
                last=got[0] if got else None,
                last_step=got[1] if got else None,
                best=got[2] if got else None,
                value=value,
                rank=position if value is not None else None,
                early_stopped_at=m.early_stopped_at,
                early_stop_reason=m.early_stop_reason,
            )
        )
    return out

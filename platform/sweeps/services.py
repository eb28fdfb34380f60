"""Writes of the sweeps app: create a sweep (every point validated before anything is stored), cancel
it, stop one of its runs early.

A sweep's runs are made by ``experiments.services.run_create`` (so each is announced and started by the
launcher like any run) and cancelled by ``run_request_cancel``; the launcher's admission keeps at most
``max_concurrent`` of a sweep's runs busy.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from experiments.config_policy import PermittedConfig, check_config
from experiments.models import CANCELLABLE_STATES, Experiment, Run, RunState
from experiments.path_policy import data_walks_once
from experiments.selectors import stored_config
from experiments.services import InvalidTransition, run_create, run_request_cancel
from rl_engine.config import ConfigError, dotted_get, merge_config, parse_config
from rl_engine.wire import EventKind
from sweeps import search_space as ss
from sweeps.models import Method, Sweep, SweepRun
from tracking.services import events_append

SEED_MAX = 2**31 - 1
MAX_POINTS_REPORTED = 5


def max_runs_limit() -> int:
    return int(getattr(settings, "SWEEP_MAX_RUNS", 100))


class SweepInvalid(ValueError):
    """The sweep cannot be made; ``errors`` are (request field path, message) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{f}: {m}" for f, m in errors))


@dataclass(frozen=True)
class EarlyStopping:
    """The median rule: a running run whose best value so far (by the goal) at its latest step ``s``
    (``s >= min_steps``) is worse than the median of the other runs' best values up to ``s`` (of those
    that reached ``s``, at least ``min_runs`` of them) is stopped."""

    min_steps: int = 0
    min_runs: int = 2

    def as_json(self) -> dict[str, int]:
        return {"min_steps": self.min_steps, "min_runs": self.min_runs}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> EarlyStopping | None:
        return None if data is None else cls(int(data["min_steps"]), int(data["min_runs"]))


@dataclass(frozen=True)
class SweepSpec:
    name: str
    method: str  # Method
    search_space: dict[str, Any]
    metric: str
    max_runs: int | None = None  # grid: default the grid's size
    max_concurrent: int = 1
    goal: str = "max"
    summary: str = "last"
    early_stopping: EarlyStopping | None = None
    seed: int | None = None  # default: drawn
    priority: int = 0


@dataclass(frozen=True)
class PlannedRun:
    index: int
    params: ss.Point
    seed: int
    config: PermittedConfig  # checked once, here: run_create does not check it again


def _short(point: ss.Point) -> str:
    text = ", ".join(f"{k}={json.dumps(v)}" for k, v in point.items())
    return text if len(text) <= 300 else text[:297] + "..."


def _field_of(path: str, point: ss.Point) -> str | None:
    """The point's field a config error at ``path`` is about (itself, inside it, or above it)."""
    for field in point:
        if path == field or path.startswith(field + ".") or field.startswith(path + "."):
            return field
    return None


def _point_errors(index: int, point: ss.Point, exc: ConfigError) -> list[tuple[str, str]]:
    out = []
    for path, msg in exc.errors:
        field = _field_of(path, point)
        where = f"search_space.{field}" if field else "search_space"
        about = "" if field == path or not path else f" (at {path})"
        out.append((where, f"point {index} ({_short(point)}): {msg}{about}"))
    return out


def sweep_plan(*, experiment: Experiment, spec: SweepSpec, seed: int) -> list[PlannedRun]:
    """Every run of the sweep, its config validated by the engine's schema and the platform's policy:
    SweepInvalid naming ``search_space.<field>`` and the point (or the size fields) otherwise."""
    try:
        space = ss.parse_search_space(spec.search_space, spec.method)  # type: ignore[arg-type]
    except ss.SearchSpaceError as exc:
        raise SweepInvalid(
            [(f"search_space.{f}" if f else "search_space", m) for f, m in exc.errors]
        ) from None
    limit = max_runs_limit()
    if spec.method == Method.GRID:
        size = space.grid_size()
        if size > limit:
            raise SweepInvalid([("search_space", f"the grid has {size} points; a sweep has at most {limit}")])
        if spec.max_runs is not None and spec.max_runs < size:
            raise SweepInvalid(
                [("max_runs", f"the grid has {size} points: raise max_runs to {size} or shrink the grid")]
            )
        n = size
    else:
        if spec.max_runs is None:
            raise SweepInvalid([("max_runs", "a random search needs max_runs (the number of runs)")])
        n = spec.max_runs
    if n > limit:
        raise SweepInvalid([("max_runs", f"at most {limit}")])
    try:
        base = stored_config(experiment).model_dump(mode="json")
    except ConfigError as exc:
        raise SweepInvalid([("experiment", f"its config is no longer valid: {exc}")]) from None
    planned: list[PlannedRun] = []
    errors: list[tuple[str, str]] = []
    bad_points = 0
    for index, point in enumerate(ss.points(space, spec.method, n=n, seed=seed)):  # type: ignore[arg-type]
        overrides = ss.overrides(point)
        if "seed" not in point:
            overrides["seed"] = seed + index
        try:
            config = parse_config(merge_config(base, overrides))
            permitted = check_config(config, project=experiment.project)
        except ConfigError as exc:
            bad_points += 1
            if bad_points <= MAX_POINTS_REPORTED:
                errors += _point_errors(index, point, exc)
            continue
        # The point as the run's config holds it (validated: "1e-6" from a YAML file is 1e-06 there).
        dump = config.model_dump(mode="json")
        params = {path: dotted_get(dump, path) for path in point}
        planned.append(PlannedRun(index=index, params=params, seed=config.seed, config=permitted))
    if errors:
        if bad_points > MAX_POINTS_REPORTED:
            errors.append(("search_space", f"{bad_points} of {n} points are invalid (the first shown)"))
        raise SweepInvalid(errors)
    return planned


@data_walks_once()  # the data paths the points name are walked once each, not once per point and check
def sweep_create(*, experiment: Experiment, user: AbstractBaseUser | None, spec: SweepSpec) -> Sweep:
    """Validate every point, then store the sweep and its runs (queued, in index order) in one
    transaction; the launcher admits them ``max_concurrent`` at a time. Raises SweepInvalid."""
    seed = spec.seed if spec.seed is not None else secrets.randbelow(SEED_MAX)
    planned = sweep_plan(experiment=experiment, spec=spec, seed=seed)
    with transaction.atomic():
        sweep = Sweep.objects.create(
            project_id=experiment.project_id,
            experiment=experiment,
            name=spec.name,
            method=spec.method,
            search_space=spec.search_space,
            max_runs=len(planned),
            max_concurrent=spec.max_concurrent,
            metric=spec.metric,
            goal=spec.goal,
            summary=spec.summary,
            early_stopping=spec.early_stopping.as_json() if spec.early_stopping else None,
            seed=seed,
            priority=spec.priority,
            created_by=user,
        )
        for plan in planned:
            run = run_create(experiment=experiment, user=user, priority=spec.priority, config=plan.config)
            SweepRun.objects.create(
                sweep=sweep, run=run, index=plan.index, params=plan.params, seed=plan.seed
            )
    return sweep


def sweep_cancel(*, sweep: Sweep, user: AbstractBaseUser | None) -> Sweep:
    """Cancel every unfinished run of the sweep (queued ones first, so that none is admitted in a slot
    a stopping one frees). Idempotent."""
    Sweep.objects.filter(pk=sweep.pk, cancelled_at=None).update(cancelled_at=timezone.now())
    runs = Run.objects.filter(sweep_member__sweep=sweep, state__in=CANCELLABLE_STATES)
    queued_first = sorted(runs, key=lambda r: (r.state != RunState.QUEUED, r.pk))
    for run in queued_first:
        try:
            run_request_cancel(run=run, user=user)
        except InvalidTransition:  # it finished meanwhile
            continue
    return Sweep.objects.get(pk=sweep.pk)


def sweep_run_stop_early(*, member: SweepRun, reason: str) -> bool:
    """Stop one run by the median rule: recorded on its sweep entry and as a run event, then cancelled.
    False when it was already stopped or is no longer running."""
    with transaction.atomic():
        marked = SweepRun.objects.filter(pk=member.pk, early_stopped_at=None).update(
            early_stopped_at=timezone.now(), early_stop_reason=reason
        )
        if not marked:
            return False
        events_append(
            run_id=member.run_id,
            kind=EventKind.LOG,
            message=f"early-stopped by sweep {member.sweep_id}: {reason}",
            data={"source": "sweep", "sweep": member.sweep_id, "early_stopped": True},
        )
        try:
            run_request_cancel(run=member.run, user=None)
        except InvalidTransition:
            transaction.set_rollback(True)
            return False
    return True

"""Reads of the experiments app: what a user may see (the API's and the pages' one visibility rule), tag
filters, the home page's counts, a run's checkpoints for its page, a stored config as the typed config,
and how the configs of runs differ."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from django.db import connection
from django.db.models import Count, Max, Q, QuerySet
from django.http import HttpRequest

from accounts.access import visible_project_ids
from experiments.config_diff import Difference, config_differences
from experiments.models import ACTIVE_STATES, Experiment, Run
from rl_engine.config import ConfigError, ExperimentConfig, parse_config


def visible_experiments(request: HttpRequest) -> QuerySet[Experiment]:
    """Experiments of the projects the user belongs to (any role)."""
    return Experiment.objects.filter(project_id__in=visible_project_ids(request)).select_related("created_by")


def visible_runs(request: HttpRequest, *only: str) -> QuerySet[Run]:
    """Runs of the projects the user belongs to (any role): the one rule every run endpoint looks a run up
    by, so that a run of another project and no run at all are the same 404. With ``only``: just those
    columns, no joins (views that read a few columns of one run)."""
    runs = Run.objects.filter(project_id__in=visible_project_ids(request))
    return runs.only(*only) if only else runs.select_related("experiment", "created_by")


def with_tag(qs: QuerySet, tag: str, field: str = "tags") -> QuerySet:
    """Rows whose JSON tag list contains ``tag`` (JSON containment isn't available on SQLite)."""
    if connection.vendor == "postgresql":
        return qs.filter(**{f"{field}__contains": [tag]})
    ids = [pk for pk, tags in qs.values_list("pk", field) if tag in (tags or [])]
    return qs.filter(pk__in=ids)


def with_run_counts(qs: QuerySet[Experiment]) -> QuerySet[Experiment]:
    """Each experiment with ``n_runs``, ``n_active`` and ``last_run`` (when its latest run was created)."""
    return qs.annotate(
        n_runs=Count("runs"),
        n_active=Count("runs", filter=Q(runs__state__in=ACTIVE_STATES)),
        last_run=Max("runs__created_at"),
    )


def stored_config(row: Experiment | Run) -> ExperimentConfig:
    """The typed config of an experiment or a run, parsed from its stored JSON: the way in from the
    database (a row may predate the engine's schema: ConfigError names what it no longer accepts)."""
    return parse_config(row.config)


def run_checkpoints(run: Run) -> list[dict[str, Any]]:
    """The run's checkpoints, latest step first, JSON-ready (``pruned``: the engine removed it)."""
    rows = run.checkpoints.order_by("-step")
    return [
        {
            "id": c.pk,
            "step": c.step,
            "path": c.path,
            "size_bytes": c.size_bytes,
            "created": c.created.isoformat(),
            "pruned": c.pruned_at is not None,
        }
        for c in rows
    ]


# --- Config diff of runs (GET /api/runs/compare, the compare page) ------------------------------------


@dataclass(frozen=True)
class ComparedConfig:
    """The config a run is compared by: its stored config validated and dumped (every default explicit,
    so a default written out equals one left implicit), or, where the stored config no longer parses
    (an older schema), the stored document as it is, with the reason."""

    document: dict[str, Any]
    basis: Literal["validated", "stored"]
    problem: str | None = None


@dataclass(frozen=True)
class ComparedRun:
    run: Run
    config: ComparedConfig


# The answer is bounded whatever the configs hold (a free-form ``model.override_config`` may hold
# thousands of keys): at most this many differing fields, each value's JSON text at most this long (a
# longer one is cut to it, as text, and its run listed in ``cut``), and at most this much value text in
# all; ``truncated`` says that something was left out.
COMPARE_MAX_DIFFERENCES = 200
COMPARE_MAX_VALUE_CHARS = 1000
COMPARE_MAX_TEXT_CHARS = 500_000


@dataclass(frozen=True)
class ShownDifference:
    """A difference as the answer shows it: the values of the runs that have the field, a value too
    long to show cut to the start of its JSON text (``cut`` lists those runs)."""

    path: str
    values: dict[int, Any]
    absent: list[int]
    cut: list[int]


@dataclass(frozen=True)
class RunComparison:
    runs: list[ComparedRun]
    differences: list[ShownDifference]
    total_differences: int = 0  # how many fields differ, shown or not
    truncated: bool = False  # fields left out (past the caps) or values cut


def compared_config(run: Run) -> ComparedConfig:
    try:
        return ComparedConfig(document=stored_config(run).model_dump(mode="json"), basis="validated")
    except ConfigError as exc:
        document = run.config if isinstance(run.config, dict) else {}
        return ComparedConfig(document=document, basis="stored", problem=str(exc))


def _shown(difference: Difference[int]) -> tuple[ShownDifference, int]:
    """The difference as shown, and the characters of value text it takes."""
    values: dict[int, Any] = {}
    cut: list[int] = []
    chars = 0
    for run_id, value in difference.present().items():
        text = json.dumps(value, ensure_ascii=False)
        if len(text) > COMPARE_MAX_VALUE_CHARS:
            values[run_id] = text[: COMPARE_MAX_VALUE_CHARS - 1] + "…"
            cut.append(run_id)
            chars += COMPARE_MAX_VALUE_CHARS
        else:
            values[run_id] = value
            chars += len(text)
    return ShownDifference(difference.path, values, difference.absent, cut), chars


def runs_compared(runs: list[Run]) -> RunComparison:
    """``runs`` (in the order given) with the leaf config fields whose value is not the same in all,
    by path, as many as the answer's bounds allow (see COMPARE_MAX_*)."""
    compared = [ComparedRun(run=run, config=compared_config(run)) for run in runs]
    differences = config_differences({c.run.pk: c.config.document for c in compared})
    shown: list[ShownDifference] = []
    text, cut_any = 0, False
    for difference in differences[:COMPARE_MAX_DIFFERENCES]:
        one, chars = _shown(difference)
        if shown and text + chars > COMPARE_MAX_TEXT_CHARS:
            break
        shown.append(one)
        text += chars
        cut_any = cut_any or bool(one.cut)
    return RunComparison(
        runs=compared,
        differences=shown,
        total_differences=len(differences),
        truncated=cut_any or len(shown) < len(differences),
    )


LINEAGE_MAX = 20


def run_lineage(run: Run) -> list[dict[str, Any]]:
    """The runs ``run`` continues (resumed or forked from, nearest first, at most LINEAGE_MAX), each
    with ``up_to_step``: the step of the checkpoint its successor started from (capped by the later
    ones), so that each curve is drawn up to where the next one takes over. Stops at a run without a
    recorded checkpoint or one of another project."""
    out: list[dict[str, Any]] = []
    current, cut, seen = run, None, {run.pk}
    while len(out) < LINEAGE_MAX and current.resumed_from_id and current.resumed_from_checkpoint_id:
        ckpt = current.resumed_from_checkpoint
        parent = (
            Run.objects.select_related("resumed_from_checkpoint")
            .filter(pk=current.resumed_from_id, project_id=run.project_id)
            .first()
        )
        if parent is None or ckpt is None or parent.pk in seen:
            break
        cut = ckpt.step if cut is None else min(cut, ckpt.step)
        out.append({"id": parent.pk, "number": parent.number, "up_to_step": cut})
        seen.add(parent.pk)
        current = parent
    return out

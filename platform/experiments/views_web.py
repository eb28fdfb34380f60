"""Server-rendered pages of the web UI. They only read (through the access rules every API view uses) and
hand the page its initial data; every change goes through the REST API from the browser (session + CSRF),
so the business rules live in one place: the services behind that API.

Objects of projects the user does not belong to do not exist for them (404), as in the API.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.access import has_role, project_roles
from accounts.ids import parse_db_id, parse_db_ids
from accounts.models import Project, Role
from alerts.models import AlertKind
from experiments.config_policy import platform_presets
from experiments.form_schema import form_schema
from experiments.models import Experiment, Run
from experiments.selectors import (
    run_checkpoints,
    run_lineage,
    visible_experiments,
    visible_runs,
    with_run_counts,
)
from experiments.services import config_to_yaml
from experiments.summary import run_states, run_summary
from rl_engine.presets import preset_names

COMPARE_MAX_RUNS = 12


def _experiments(request: HttpRequest) -> QuerySet[Experiment]:
    """The API's visibility rule (experiments of the user's projects), for a page."""
    return visible_experiments(request).select_related("project")


def _runs(request: HttpRequest) -> QuerySet[Run]:
    return visible_runs(request).select_related("project")


def _visible_or_404(qs: QuerySet, pk: int) -> Any:
    obj = qs.filter(pk=pk).first()
    if obj is None:
        raise Http404("Not found.")
    return obj


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """Projects the user belongs to, each with its experiments (run counts, last activity)."""
    roles = project_roles(request)
    projects = list(Project.objects.filter(pk__in=list(roles)).order_by("name", "id"))
    experiments = with_run_counts(_experiments(request)).order_by("-created_at")
    by_project: dict[int, list[Experiment]] = {p.pk: [] for p in projects}
    for exp in experiments:
        by_project[exp.project_id].append(exp)
    recent_runs = _runs(request).order_by("-created_at")[:10]
    return render(
        request,
        "web/home.html",
        {
            "projects": [
                {"project": p, "role": roles[p.pk], "experiments": by_project[p.pk]} for p in projects
            ],
            "recent_runs": recent_runs,
        },
    )


@login_required
def project_settings(request: HttpRequest, pk: int) -> HttpResponse:
    """A project's settings: its webhooks and their deliveries (owners; docs/dashboard.md, "Project
    settings"), managed from the browser through /api/webhooks."""
    roles = project_roles(request)
    if pk not in roles:
        raise Http404("Not found.")
    project = Project.objects.get(pk=pk)
    is_owner = roles[pk] == Role.OWNER
    return render(
        request,
        "web/project.html",
        {
            "project": project,
            "role": roles[pk],
            "is_owner": is_owner,
            "page_data": {
                "project": project.pk,
                "is_owner": is_owner,
                "events": [{"value": k.value, "label": k.label} for k in AlertKind],
            },
        },
    )


@login_required
def experiment_new(request: HttpRequest) -> HttpResponse:
    """The form: a preset, a blank config or a copy of an experiment (``?from=<id>``), rendered from the schema."""
    roles = project_roles(request)
    writable = [
        p
        for p in Project.objects.filter(pk__in=list(roles)).order_by("name")
        if has_role(request, p.pk, Role.MEMBER)
    ]
    start: dict[str, Any] = {"preset": "demo-cpu" if "demo-cpu" in preset_names() else None}
    source_id = parse_db_id(request.GET.get("from"))
    if source_id is not None:
        source = _visible_or_404(_experiments(request), source_id)
        start = {
            "preset": None,
            "config": source.config,
            "name": f"{source.name} (copy)",
            "project": source.project_id,
            "description": source.description,
            "tags": source.tags,
        }
    elif request.GET.get("preset") in preset_names():
        start["preset"] = request.GET["preset"]
    project_id = parse_db_id(request.GET.get("project"))
    if project_id is not None:
        start["project"] = project_id
    # The form of the project the page opens on (the first one unless asked); another project's form is
    # fetched when the user picks it (GET /api/schema/experiment?project=ID).
    shown = next((p for p in writable if p.pk == start.get("project")), writable[0] if writable else None)
    return render(
        request,
        "web/experiment_new.html",
        {
            "projects": writable,
            "page_data": {
                "schema": form_schema(shown) if shown else None,
                "presets": platform_presets(),
                "projects": [{"id": p.pk, "name": p.name} for p in writable],
                "start": start,
            },
        },
    )


@login_required
def experiment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    exp = _visible_or_404(_experiments(request), pk)
    runs = exp.runs.select_related("created_by").order_by("-number")
    return render(
        request,
        "web/experiment_detail.html",
        {
            "experiment": exp,
            "runs": runs,
            "config_yaml": config_to_yaml(exp.config),
            "can_write": has_role(request, exp.project_id, Role.MEMBER),
            "page_data": run_states(),
        },
    )


@login_required
def run_dashboard(request: HttpRequest, pk: int) -> HttpResponse:
    run = _visible_or_404(_runs(request).select_related("resumed_from", "resumed_from_checkpoint"), pk)
    return render(
        request,
        "web/run_dashboard.html",
        {
            "run": run,
            "config_yaml": config_to_yaml(run.config),
            "can_write": has_role(request, run.project_id, Role.MEMBER),
            "page_data": {
                "run": run_summary(run),
                "checkpoints": run_checkpoints(run),
                "can_write": has_role(request, run.project_id, Role.MEMBER),
                "lineage": run_lineage(run),  # fork: the curves this run continues
            },
        },
    )


@login_required
def compare(request: HttpRequest) -> HttpResponse:
    """Overlay one metric across runs: ``?runs=1,2,3&key=reward/mean``."""
    chosen = parse_db_ids(request.GET.get("runs", ""), limit=COMPARE_MAX_RUNS)
    candidates = _runs(request).order_by("-created_at")[:200]
    visible_chosen = {r.pk: r for r in _runs(request).filter(pk__in=chosen)}
    runs = [visible_chosen[pk] for pk in chosen if pk in visible_chosen]
    return render(
        request,
        "web/compare.html",
        {
            "candidates": candidates,
            "page_data": {
                "runs": [
                    {"id": r.pk, "label": f"{r.experiment.name} #{r.number}", "state": r.state} for r in runs
                ],
                "candidates": [
                    {"id": r.pk, "label": f"{r.experiment.name} #{r.number}", "state": r.state}
                    for r in candidates
                ],
                "key": request.GET.get("key", "reward/mean")[:200],
                "max_runs": COMPARE_MAX_RUNS,
            },
        },
    )

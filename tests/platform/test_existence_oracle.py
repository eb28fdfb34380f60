"""No endpoint tells an object of another project from no object at all (docs/api.md, "Permissions").

Every API route with an id in its path is taken from the URL conf (a new route is covered without
editing this test; a route whose kind of object the test cannot make fails it), and each of its methods
is called by a member of one project twice: with the id of another project's object, and with an id
that exists nowhere. The two answers must be the same status and the same body."""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from accounts.models import Invitation, Membership
from accounts.services import token_create
from alerts.models import AlertKind, MetricRule, Webhook
from alerts.services import alert_raise
from experiments.services import run_create, run_transition
from sweeps.services import SweepSpec, sweep_create
from tests.factories import ExperimentFactory, checkpoint_path
from tests.platform.conftest import client_for
from tracking.services import checkpoint_record

MISSING = 987_654_321
METHODS = ("get", "post", "put", "patch", "delete")


def api_routes() -> list[tuple[str, type]]:
    """(route, view class) of every API route that takes an integer id, from the URL conf."""

    def walk(patterns, prefix=""):
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                yield prefix + str(p.pattern), getattr(p.callback, "view_class", None)

    return [
        (route, view)
        for route, view in walk(get_resolver().url_patterns)
        if route.startswith("api/") and "<int:" in route and view is not None
    ]


ROUTES = api_routes()
RUN_ROUTES = [r for r, _ in ROUTES if r.startswith("api/runs/<int:")]


def test_the_walk_finds_the_run_scoped_routes():
    # A floor, not the list: the routes the review named are among those walked.
    for tail in ("metrics", "metrics/keys", "events", "checkpoints", "samples", "metrics/export/csv",
                 "metrics/export/json", "exports", "checkpoints/<int:step>/export"):  # fmt: skip
        assert f"api/runs/<int:run_id>/{tail}" in RUN_ROUTES


@pytest.fixture
def others(team):
    """Objects of a project the member is not in (the stranger's), by the kind of id a route takes."""
    stranger, project = team["stranger"], team["other_project"]
    exp = ExperimentFactory(project=project, created_by=stranger)
    run = run_create(experiment=exp, user=stranger)
    run_transition(run_id=run.pk, to="failed", error="x")
    checkpoint_record(run_id=run.pk, step=1, path=checkpoint_path(run, 1))
    sweep = sweep_create(
        experiment=exp,
        user=stranger,
        spec=SweepSpec(name="s", method="grid", search_space={"trainer.lr": [1e-6]}, metric="k"),
    )
    return {
        "projects": project.pk,
        "experiments": exp.pk,
        "runs": run.pk,
        "sweeps": sweep.pk,
        "alerts": alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="x").alert.pk,
        "alert-rules": MetricRule.objects.create(project=project, metric="k", kind="missing", steps=3).pk,
        "webhooks": Webhook.objects.create(project=project, url="https://93.184.216.34/h", secret="s").pk,
        "tokens": token_create(user=stranger, name="theirs").token.pk,
        "invitations": Invitation.objects.create(project=project, username="someone", invited_by=stranger).pk,
        # second ids, under a project or a run
        "membership_id": Membership.objects.get(project=project, user=stranger).pk,
        "project token_id": token_create(user=stranger, name="scoped", project=project).token.pk,
        "invitation_id": Invitation.objects.create(
            project=project, username="another", invited_by=stranger
        ).pk,
        "step": 1,
    }


def _url(route: str, first: int, others: dict) -> str:
    """The route with its first id ``first`` and any later id that of the other project's object."""
    kind = route.split("/")[1]
    names = re.findall(r"<int:(\w+)>", route)

    def later(name: str) -> int:
        key = "project token_id" if (kind, name) == ("projects", "token_id") else name
        if key not in others:
            pytest.fail(f"{route}: the test cannot make another project's {name!r}; add it to `others`")
        return others[key]

    values = [first] + [later(n) for n in names[1:]]
    it = iter(values)
    return "/" + re.sub(r"<int:\w+>", lambda m: str(next(it)), route)


def _call(client, method: str, url: str):
    resp = getattr(client, method)(url, {}, format="json")
    return resp.status_code, resp.content


@pytest.mark.parametrize(("route", "view"), ROUTES, ids=[r for r, _ in ROUTES])
def test_another_projects_object_and_no_object_answer_alike(team, others, route, view):
    kind = route.split("/")[1]
    if kind not in others:
        pytest.fail(f"{route}: the test cannot make another project's {kind}; add it to `others`")
    client = client_for(team["member"])
    methods = [m for m in METHODS if hasattr(view, m)]
    assert methods, route
    for method in methods:
        theirs = _call(client, method, _url(route, others[kind], others))
        nothing = _call(client, method, _url(route, MISSING, others))
        assert theirs == nothing, f"{method.upper()} /{route}: {theirs} vs {nothing}"
        assert theirs[0] in (404, 400, 405), f"{method.upper()} /{route}: {theirs}"

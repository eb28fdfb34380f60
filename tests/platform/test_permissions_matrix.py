"""Every API endpoint for each of owner, member, viewer, stranger (member of another project), anonymous.

Policy under test (docs/api.md): objects outside your projects are 404 (their ids leak nothing), a
visible object your role may not change is 403, no credentials is 401; viewer reads, member also
writes experiments/runs/metrics, owner also manages the project, its memberships and tokens. A denied
request changes nothing (checked with a fingerprint of the database). Requests carry real API tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from drf_spectacular.generators import SchemaGenerator

from accounts.models import ApiToken, Membership, Project
from accounts.services import ingest_token_issue, member_invite, token_create
from alerts.models import Alert, AlertKind, MetricRule, Webhook
from alerts.services import alert_raise
from experiments.models import Experiment, Run, RunState
from experiments.services import config_to_yaml, run_create, run_transition
from sweeps.models import Sweep
from sweeps.services import SweepSpec, sweep_create
from tests.factories import ExperimentFactory, UserFactory, checkpoint_path, demo_config
from tests.platform.conftest import client_for
from tracking.models import Checkpoint, MetricPoint, RunEvent, Sample
from tracking.services import Point, checkpoint_record, events_append, metrics_ingest

ROLES = ["owner", "member", "viewer", "stranger", "anonymous"]
RANK = {"viewer": 1, "member": 2, "owner": 3}


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # {placeholders} filled from the world fixture
    needs: str  # public | auth | list | self | viewer | member | owner
    ok: int
    body: object = None


def _points():
    return {"points": [{"key": "k", "step": 99, "value": 1.0, "wall_time": 0.0}]}


ENDPOINTS = [
    Endpoint("GET", "/api/me", "auth", 200),
    Endpoint("GET", "/api/projects", "list", 200),
    Endpoint("POST", "/api/projects", "auth", 201, {"name": "new"}),
    Endpoint("GET", "/api/projects/{project}", "viewer", 200),
    Endpoint("PATCH", "/api/projects/{project}", "owner", 200, {"description": "changed"}),
    # The world's project has an active run: the owner gets past the permission check to the 409.
    Endpoint("DELETE", "/api/projects/{project}", "owner", 409),
    Endpoint("GET", "/api/projects/{project}/members", "viewer", 200),
    Endpoint(
        "POST", "/api/projects/{project}/members", "owner", 202, {"username": "newbie", "role": "viewer"}
    ),
    Endpoint("GET", "/api/projects/{project}/invitations", "owner", 200),
    Endpoint("DELETE", "/api/projects/{project}/invitations/{invitation}", "owner", 204),
    Endpoint("GET", "/api/invitations", "auth", 200),
    Endpoint("DELETE", "/api/invitations/{my_invitation}", "self", 204),
    Endpoint("POST", "/api/invitations/{my_invitation}/accept", "self", 201),
    Endpoint("PATCH", "/api/projects/{project}/members/{membership}", "owner", 200, {"role": "member"}),
    Endpoint("DELETE", "/api/projects/{project}/members/{membership}", "owner", 204),
    Endpoint("GET", "/api/projects/{project}/tokens", "owner", 200),
    Endpoint("DELETE", "/api/projects/{project}/tokens/{ingest_token}", "owner", 204),
    Endpoint("GET", "/api/tokens", "auth", 200),
    Endpoint("POST", "/api/tokens", "auth", 201, {"name": "script"}),
    # Credentials in the body, whoever sends it (a header or a session is ignored).
    Endpoint("POST", "/api/tokens/login", "public", 201, {"username": "owner", "password": "pw-for-tests"}),
    Endpoint("GET", "/api/tokens/{owner_token}", "self", 200),
    Endpoint("DELETE", "/api/tokens/{owner_token}", "self", 204),
    Endpoint("GET", "/api/experiments", "list", 200),
    Endpoint("POST", "/api/experiments", "member", 201, "experiment_body"),
    Endpoint("POST", "/api/experiments/import", "member", 201, "import_body"),
    Endpoint("GET", "/api/experiments/{experiment}", "viewer", 200),
    Endpoint("PUT", "/api/experiments/{experiment}", "member", 200, "experiment_body"),
    Endpoint("PATCH", "/api/experiments/{experiment}", "member", 200, {"description": "changed"}),
    Endpoint("DELETE", "/api/experiments/{idle_experiment}", "member", 204),
    Endpoint("POST", "/api/experiments/{experiment}/clone", "member", 201, {}),
    Endpoint("GET", "/api/experiments/{experiment}/yaml", "viewer", 200),
    Endpoint("GET", "/api/schema/experiment", "public", 200),
    Endpoint("GET", "/api/schema/experiment?project={project}", "viewer", 200),  # the project's form
    Endpoint("GET", "/api/presets", "public", 200),
    Endpoint("GET", "/api/presets/demo-cpu", "public", 200),
    Endpoint("GET", "/api/models", "auth", 200),
    Endpoint("GET", "/api/rewards", "auth", 200),  # the engine's environment's rewards
    Endpoint("GET", "/api/tasks", "auth", 200),
    Endpoint("GET", "/api/runs", "list", 200),
    Endpoint("POST", "/api/runs", "member", 201, "run_body"),
    Endpoint("GET", "/api/runs/{run}", "viewer", 200),
    Endpoint("POST", "/api/runs/{run}/cancel", "member", 200),
    Endpoint("POST", "/api/runs/{done_run}/resume", "member", 201, {}),
    Endpoint("POST", "/api/runs/{run}/metrics", "member", 200, _points()),
    Endpoint("GET", "/api/runs/{run}/metrics", "viewer", 200),
    Endpoint("GET", "/api/runs/{run}/metrics/keys", "viewer", 200),
    Endpoint("GET", "/api/runs/{run}/metrics/export/csv", "viewer", 200),
    Endpoint("GET", "/api/runs/{run}/metrics/export/json", "viewer", 200),
    Endpoint("POST", "/api/runs/{run}/events", "member", 201, {"events": [{"kind": "log", "message": "m"}]}),
    Endpoint("GET", "/api/runs/{run}/events", "viewer", 200),
    Endpoint("POST", "/api/runs/{run}/heartbeat", "member", 200),
    Endpoint(
        "POST",
        "/api/runs/{run}/samples",
        "member",
        201,
        {"samples": [{"step": 1, "prompt": "p", "response": "r"}]},
    ),
    Endpoint("GET", "/api/runs/{run}/samples", "viewer", 200),
    Endpoint("GET", "/api/runs/{run}/checkpoints", "viewer", 200),
    # Config diff (issue 22): several runs at once; one the caller cannot see makes it a 404.
    Endpoint("GET", "/api/runs/compare?ids={run},{done_run}", "viewer", 200),
    # fork (issue 22)
    Endpoint(
        "POST", "/api/runs/{done_run}/fork", "member", 201, {"config_overrides": {"trainer": {"lr": 1e-6}}}
    ),
    # --- alerts (issue 22): members resolve alerts and manage rules; webhooks are the owner's ---
    Endpoint("GET", "/api/alerts", "list", 200),
    Endpoint("POST", "/api/alerts/{alert}/resolve", "member", 200),
    Endpoint("GET", "/api/alert-rules", "list", 200),
    Endpoint("POST", "/api/alert-rules", "member", 201, "rule_body"),
    Endpoint("GET", "/api/alert-rules/{rule}", "viewer", 200),
    Endpoint("PATCH", "/api/alert-rules/{rule}", "member", 200, {"steps": 7}),
    Endpoint("DELETE", "/api/alert-rules/{rule}", "member", 204),
    Endpoint("GET", "/api/webhooks", "list", 200),
    Endpoint("POST", "/api/webhooks", "owner", 201, "webhook_body"),
    Endpoint("GET", "/api/webhooks/{webhook}", "owner", 200),
    Endpoint("PATCH", "/api/webhooks/{webhook}", "owner", 200, {"active": False}),
    Endpoint("DELETE", "/api/webhooks/{webhook}", "owner", 204),
    Endpoint("GET", "/api/webhooks/{webhook}/deliveries", "owner", 200),
    # --- sweeps (issue 22): every member reads; a member creates and cancels ---
    Endpoint("GET", "/api/sweeps", "list", 200),
    Endpoint("POST", "/api/sweeps", "member", 201, "sweep_body"),
    Endpoint("GET", "/api/sweeps/{sweep}", "viewer", 200),
    Endpoint("POST", "/api/sweeps/{sweep}/cancel", "member", 200),
]


@pytest.fixture
def world(team):
    exp = ExperimentFactory(project=team["project"], created_by=team["member"])
    idle = ExperimentFactory(project=team["project"])
    run = run_create(experiment=exp, user=team["member"])
    metrics_ingest(run_id=run.pk, points=[Point("k", s, 1.0, 0.0) for s in range(5)])
    events_append(run_id=run.pk, kind="log", message="hello")
    done = run_create(experiment=exp, user=team["member"])
    run_transition(run_id=done.pk, to=RunState.FAILED, error="x")
    checkpoint_record(run_id=done.pk, step=3, path=checkpoint_path(done, 3))
    UserFactory(username="newbie")
    # The owner's client token, and a token created with it: a token manages itself and its descendants.
    owner_client = token_create(user=team["owner"], name="matrix")
    owner_token = token_create(user=team["owner"], name="owner's", parent=owner_client.token).token
    ids = {
        "project": team["project"].pk,
        "experiment": exp.pk,
        "idle_experiment": idle.pk,
        "run": run.pk,
        "done_run": done.pk,
        "owner_token": owner_token.pk,
        "invitation": member_invite(project=team["project"], username="newbie", role="viewer", by=None).pk,
        # addressed to the owner's account ("self": only the owner sees it)
        "my_invitation": member_invite(
            project=team["other_project"], username="owner", role="viewer", by=None
        ).pk,
        "membership": Membership.objects.get(project=team["project"], user=team["viewer"]).pk,
        "ingest_token": ingest_token_issue(run=run).token.pk,
        # alerts (issue 22)
        "alert": alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="stalled").alert.pk,
        "rule": MetricRule.objects.create(project=team["project"], metric="k", kind="missing", steps=3).pk,
        "webhook": Webhook.objects.create(
            project=team["project"], url="https://93.184.216.34/h", secret="s"
        ).pk,
        # sweeps (issue 22)
        "sweep": sweep_create(
            experiment=exp,
            user=team["member"],
            spec=SweepSpec(name="s", method="grid", search_space={"trainer.lr": [1e-6, 2e-6]}, metric="k"),
        ).pk,
    }
    bodies = {
        "experiment_body": {"project": ids["project"], "name": "e", "config": demo_config()},
        "import_body": {"project": ids["project"], "name": "y", "yaml": config_to_yaml(exp.config)},
        "run_body": {"experiment": exp.pk},
        "rule_body": {"project": ids["project"], "metric": "loss", "kind": "missing", "steps": 5},
        "webhook_body": {"project": ids["project"], "url": "https://93.184.216.34/hook"},
        "sweep_body": {
            "experiment": exp.pk,
            "method": "grid",
            "search_space": {"trainer.lr": [1e-6]},
            "metric": "k",
        },
    }
    return {"ids": ids, "bodies": bodies, "owner_secret": owner_client.secret, **team}


def fingerprint() -> tuple:
    """Everything a denied request must leave untouched."""
    return (
        tuple(Project.objects.order_by("pk").values_list("pk", "name", "description")),
        tuple(Membership.objects.order_by("pk").values_list("pk", "role")),
        tuple(ApiToken.objects.order_by("pk").values_list("pk", "revoked_at")),
        tuple(Experiment.objects.order_by("pk").values_list("pk", "name", "description", "updated_at")),
        tuple(Run.objects.order_by("pk").values_list("pk", "state", "heartbeat_at")),
        MetricPoint.objects.count(),
        RunEvent.objects.count(),
        Sample.objects.count(),
        Checkpoint.objects.count(),
        # alerts (issue 22)
        tuple(Alert.objects.order_by("pk").values_list("pk", "resolved_at", "count")),
        tuple(MetricRule.objects.order_by("pk").values_list("pk", "steps", "active")),
        tuple(Webhook.objects.order_by("pk").values_list("pk", "url", "active")),
        # sweeps (issue 22)
        tuple(Sweep.objects.order_by("pk").values_list("pk", "cancelled_at")),
    )


def expected_status(ep: Endpoint, role: str) -> int:
    if ep.needs == "public":
        return ep.ok
    if role == "anonymous":
        return 401
    if ep.needs in ("auth", "list"):
        return ep.ok
    if ep.needs == "self":
        return ep.ok if role == "owner" else 404
    if role == "stranger":
        return 404
    return ep.ok if RANK[role] >= RANK[ep.needs] else 403


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("ep", ENDPOINTS, ids=lambda ep: f"{ep.method} {ep.path}")
def test_endpoint_answers_each_role_by_the_policy(world, ep, role):
    if role == "anonymous":
        client = client_for()
    elif role == "owner":
        client = client_for(token=world["owner_secret"])
    else:
        client = client_for(token=token_create(user=world[role], name="matrix").secret)
    path = ep.path.format(**world["ids"])
    body = world["bodies"].get(ep.body, ep.body) if isinstance(ep.body, str) else ep.body
    before = fingerprint()
    data = json.dumps(body) if body is not None else ""
    resp = client.generic(ep.method, path, data, content_type="application/json")
    want = expected_status(ep, role)
    assert resp.status_code == want, f"{role} {ep.method} {path}: {resp.status_code} {resp.content[:300]!r}"
    if want >= 400:
        after = fingerprint()
        # Token bookkeeping (last_used_at) is not part of the fingerprint; nothing else may change.
        assert after == before, f"{role} was refused {ep.method} {path} but the database changed"
    if ep.needs == "list" and role == "stranger":
        listed = resp.json()["results"]
        assert all(item.get("project", item.get("id")) != world["ids"]["project"] for item in listed)
        assert listed == [] or ep.path == "/api/projects"


def test_the_matrix_covers_every_endpoint_of_the_openapi_document():
    """Every documented operation served by accounts/experiments/tracking/alerts has a row in ENDPOINTS."""
    import re

    from django.urls import resolve

    schema = SchemaGenerator().get_schema(request=None, public=True)
    documented = set()
    for path, ops in schema["paths"].items():
        view = resolve(re.sub(r"\{[^}]+\}", "1", path)).func
        if view.__module__.split(".")[0] in {"accounts", "experiments", "tracking", "alerts", "sweeps"}:
            documented |= {(method.upper(), path) for method in ops}
    covered = {(ep.method, _template(ep.path)) for ep in ENDPOINTS}
    assert len(documented) >= 40
    missing = documented - covered
    assert not missing, f"endpoints without a permission test: {sorted(missing)}"


def _template(path: str) -> str:
    """Our placeholders -> the OpenAPI document's parameter names."""
    import re

    path = path.split("?", 1)[0]  # a query string is not part of the documented path
    path = re.sub(r"^/api/projects/\{project\}", "/api/projects/{id}", path)
    path = path.replace("/api/projects/{id}/", "/api/projects/{project_id}/")
    path = path.replace("{membership}", "{membership_id}").replace("{ingest_token}", "{token_id}")
    path = path.replace("{my_invitation}", "{invitation_id}").replace("{invitation}", "{invitation_id}")
    path = path.replace("/api/tokens/{owner_token}", "/api/tokens/{token_id}")
    path = re.sub(r"/api/experiments/\{(idle_)?experiment\}", "/api/experiments/{id}", path)
    path = re.sub(r"/api/runs/\{(done_)?run\}$", "/api/runs/{id}", path)
    path = re.sub(r"/api/runs/\{run\}/(cancel)$", r"/api/runs/{id}/\1", path)
    path = re.sub(r"/api/runs/\{done_run\}/resume", "/api/runs/{id}/resume", path)
    path = re.sub(r"/api/runs/\{done_run\}/fork", "/api/runs/{id}/fork", path)  # fork (issue 22)
    path = path.replace("/api/runs/{run}/", "/api/runs/{run_id}/")
    path = re.sub(r"/api/(alerts|alert-rules|webhooks)/\{(alert|rule|webhook)\}", r"/api/\1/{id}", path)
    path = path.replace("/api/sweeps/{sweep}", "/api/sweeps/{id}")  # sweeps (issue 22)
    return path.replace("/api/presets/demo-cpu", "/api/presets/{name}")


def test_a_token_limited_to_one_project_sees_only_that_project(world):
    other = world["other_project"]
    Membership.objects.create(project=other, user=world["member"], role="member")
    limited = client_for(token=token_create(user=world["member"], name="ci", project=world["project"]).secret)
    assert {p["id"] for p in limited.get("/api/projects").json()["results"]} == {world["ids"]["project"]}
    assert limited.get(f"/api/projects/{other.pk}").status_code == 404
    everywhere = client_for(token=token_create(user=world["member"], name="all").secret)
    assert {p["id"] for p in everywhere.get("/api/projects").json()["results"]} == {
        world["ids"]["project"],
        other.pk,
    }

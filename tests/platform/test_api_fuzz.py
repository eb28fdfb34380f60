"""schemathesis drives every operation of the live OpenAPI document (in-process WSGI app) with generated
valid and invalid requests, authenticated as a project owner: no 5xx, ever, and 2xx bodies match the
documented schema. Path ids point at real objects half of the time (else mostly 404)."""

from __future__ import annotations

import json

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import response_schema_conformance

from accounts.models import Membership
from accounts.services import ingest_token_issue, token_create
from experiments.services import run_create, run_transition
from tests.factories import ExperimentFactory, checkpoint_path
from tracking.services import Point, checkpoint_record, metrics_ingest

# Loaded at collection from the running code (no database needed to render the document).
schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())


@pytest.fixture
def keep_db_connection(db):
    """Like Django's test client: a raw WSGI call would otherwise close the test's DB connection (and
    roll back its transaction) at the end of every request."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def fuzz_world(team, keep_db_connection):
    exp = ExperimentFactory(project=team["project"], created_by=team["owner"])
    run = run_create(experiment=exp, user=team["owner"])
    metrics_ingest(run_id=run.pk, points=[Point("k", s, float(s), 0.0) for s in range(50)])
    done = run_create(experiment=exp, user=team["owner"])
    run_transition(run_id=done.pk, to="failed", error="x")
    checkpoint_record(run_id=done.pk, step=1, path=checkpoint_path(done, 1))
    token = token_create(user=team["owner"], name="fuzz")
    ids = {
        "project": team["project"].pk,
        "experiment": exp.pk,
        "run": run.pk,
        "membership": Membership.objects.get(project=team["project"], user=team["viewer"]).pk,
        "own_token": token.token.pk,
        "ingest_token": ingest_token_issue(run=run).token.pk,
    }
    return {"ids": ids, "auth": f"Token {token.secret}"}


def _real_id(path: str, param: str, ids: dict[str, int]) -> int | None:
    if param == "project_id" or (param == "id" and path.startswith("/api/projects/")):
        return ids["project"]
    if param == "id" and path.startswith("/api/experiments/"):
        return ids["experiment"]
    if param in ("id", "run_id"):
        return ids["run"]
    if param == "membership_id":
        return ids["membership"]
    if param == "token_id":
        return ids["ingest_token"] if "/projects/" in path else ids["own_token"]
    return None


@schema.parametrize()
@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_request_produces_a_server_error(case, fuzz_world):
    params = case.path_parameters or {}
    for name, value in list(params.items()):
        real = _real_id(case.operation.path, name, fuzz_world["ids"])
        if real is not None and isinstance(value, int) and value % 2 == 0:
            params[name] = real
    response = case.call(headers={"Authorization": fuzz_world["auth"]})
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}"
    )
    if 200 <= response.status_code < 300 and response.headers.get("Content-Type", "").startswith(
        "application/json"
    ):
        case.validate_response(response, checks=[response_schema_conformance])


HOSTILE_BODIES = {
    "deeply nested JSON": "[" * 20_000 + "]" * 20_000,  # 40 kB: far past json's recursion limit
    "JSON nested past the limit": json.dumps({"config": json.loads("[" * 80 + "]" * 80)}),
    "a body over the upload limit": json.dumps({"name": "x" * 60_000}),  # the test's limit: 50 kB
}
HOSTILE_CHECKPOINTS = [
    {"step": "abc", "path": "/x"},
    {"step": 2**70, "path": "/x"},
    {"step": 1, "path": ["/x"]},
]


def _operations_with_a_body() -> list[tuple[str, str]]:
    from drf_spectacular.generators import SchemaGenerator

    doc = SchemaGenerator().get_schema(request=None, public=True)
    return sorted(
        (method.upper(), path)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if method in ("post", "put", "patch") and "requestBody" in op
    )


@pytest.mark.parametrize(("method", "path"), _operations_with_a_body())
def test_hostile_bodies_are_a_4xx_on_every_operation(method, path, fuzz_world, settings):
    """Shapes the generator does not produce: recursion-deep JSON, nesting past the platform's limit, a
    body over the upload limit. Every operation that reads a body answers 400 or 413, never a 500."""
    import re

    from rest_framework.test import APIClient

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 50_000
    url = re.sub(r"\{([^}]+)\}", lambda m: str(_real_id(path, m.group(1), fuzz_world["ids"]) or 1), path)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=fuzz_world["auth"])
    for name, body in HOSTILE_BODIES.items():
        resp = client.generic(method, url, body, content_type="application/json")
        want = 413 if "upload limit" in name else 400
        assert resp.status_code == want, f"{name}: {method} {url}: {resp.status_code} {resp.content[:300]!r}"


@pytest.mark.parametrize("data", HOSTILE_CHECKPOINTS, ids=["step abc", "step 2**70", "path a list"])
def test_malformed_checkpoint_events_are_a_400(data, fuzz_world):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=fuzz_world["auth"])
    body = {"events": [{"kind": "checkpoint", "data": data}]}
    resp = client.post(f"/api/runs/{fuzz_world['ids']['run']}/events", body, format="json")
    assert resp.status_code == 400 and any(k.startswith("events[0].data.") for k in resp.json()["errors"])

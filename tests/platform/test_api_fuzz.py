"""schemathesis drives every operation of the live OpenAPI document (in-process WSGI app) with generated
valid and invalid requests, authenticated as a project owner: no 5xx, ever, and 2xx bodies match the
documented schema. Path ids point at real objects half of the time (else mostly 404). Free-form values
(event data, samples, configs as JSON and YAML) are also generated with what a store cannot hold:
non-finite numbers, lone surrogates, NUL."""

from __future__ import annotations

import json
import math

import pytest
import schemathesis
import yaml
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import response_schema_conformance

from accounts.models import Membership
from accounts.services import ingest_token_issue, token_create
from alerts.models import AlertKind, MetricRule, Webhook
from alerts.services import alert_raise
from experiments.services import run_create, run_transition
from sweeps.services import SweepSpec, sweep_create
from tests.factories import ExperimentFactory, checkpoint_path, demo_config
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
        "alert": alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="stalled").alert.pk,
        "rule": MetricRule.objects.create(project=team["project"], metric="k", kind="missing", steps=3).pk,
        "webhook": Webhook.objects.create(
            project=team["project"], url="https://93.184.216.34/h", secret="s"
        ).pk,
        # sweeps (issue 22)
        "sweep": sweep_create(
            experiment=exp,
            user=team["owner"],
            spec=SweepSpec(name="s", method="grid", search_space={"trainer.lr": [1e-6, 2e-6]}, metric="k"),
        ).pk,
    }
    return {"ids": ids, "auth": f"Token {token.secret}"}


def _real_id(path: str, param: str, ids: dict[str, int]) -> int | None:
    if param == "project_id" or (param == "id" and path.startswith("/api/projects/")):
        return ids["project"]
    if param == "id" and path.startswith("/api/experiments/"):
        return ids["experiment"]
    for prefix, key in (
        ("/api/alerts/", "alert"),
        ("/api/alert-rules/", "rule"),
        ("/api/webhooks/", "webhook"),
        ("/api/sweeps/", "sweep"),  # sweeps (issue 22)
    ):
        if param == "id" and path.startswith(prefix):
            return ids[key]
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


# --- free-form values a store cannot hold: property-based, JSON and YAML ---------------------------------

NASTY_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),  # any valid character
        st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff"]),  # NUL and lone surrogates
    ),
    max_size=8,
)
NASTY_NUMBER = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),  # NaN and +-Infinity, written as 1e400 below
)
# What a store cannot hold, drawn often (not left to the odds of the broad strategies above).
NASTY_LEAF = st.sampled_from([math.inf, -math.inf, math.nan, "\ud800", "a\x00b", "\udc00z", "ok", 1.5])
FREE_JSON = st.recursive(
    st.one_of(NASTY_LEAF, st.none(), st.booleans(), NASTY_NUMBER, NASTY_TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(NASTY_TEXT, inner, max_size=4)),
    max_leaves=12,
)


def json_text(value: object) -> str:
    """``value`` as the JSON text a hostile client sends: infinities as ``1e400`` (parsed back to inf),
    NaN as ``NaN`` (a literal strict JSON refuses), surrogates and NUL as ``\\u`` escapes."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("1e400" if value > 0 else "-1e400")
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(json_text(v) for v in value) + "]"
    return json.dumps(value)


def _api(fuzz_world):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=fuzz_world["auth"])
    return client


FREE_SETTINGS = settings(
    max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


@FREE_SETTINGS
@given(data=FREE_JSON, message=NASTY_TEXT, prompt=NASTY_TEXT)
@example(data={"x": math.inf}, message="ok", prompt="ok")
@example(data=["a", "\ud800"], message="\udc00", prompt="a\x00")
def test_free_form_event_and_sample_data_is_stored_and_listed_or_a_400(fuzz_world, data, message, prompt):
    """Whatever free-form ``data``, message or prompt an engine reports: a 2xx after which the run's
    events and samples still list, or a 400 naming a field; never a 500."""
    client, run = _api(fuzz_world), fuzz_world["ids"]["run"]
    event = f'{{"kind": "log", "message": {json.dumps(message)}, "data": {{"v": {json_text(data)}}}}}'
    body = f'{{"events": [{event}]}}'
    resp = client.generic("POST", f"/api/runs/{run}/events", body, content_type="application/json")
    assert resp.status_code in (201, 400), resp.content[:300]
    if resp.status_code == 400:
        assert resp.json().get("errors") or resp.json()["detail"], resp.content
    sample = f'{{"prompt": {json.dumps(prompt)}, "response": {json_text(message)}}}'
    body = f'{{"step": 1, "samples": [{sample}]}}'
    resp = client.generic("POST", f"/api/runs/{run}/samples", body, content_type="application/json")
    assert resp.status_code in (201, 400), resp.content[:300]
    assert client.get(f"/api/runs/{run}/events").status_code == 200
    assert client.get(f"/api/runs/{run}/samples").status_code == 200


@FREE_SETTINGS
@given(data=FREE_JSON)
@example(data=math.inf)
@example(data=math.nan)
@example(data={"s": "\ud800"})
@example(data=["a\x00"])
def test_free_form_config_values_are_an_experiment_or_a_400_as_json_and_as_yaml(fuzz_world, data):
    """The same values inside a config (``reward.kwargs``), sent as JSON and imported as YAML."""
    client, project = _api(fuzz_world), fuzz_world["ids"]["project"]
    cfg = demo_config()
    cfg["reward"]["kwargs"] = {"PLACEHOLDER": 0}
    config = json.dumps(cfg).replace('{"PLACEHOLDER": 0}', json_text({"v": data}))
    body = f'{{"project": {project}, "name": "fuzz", "config": {config}}}'
    resp = client.generic("POST", "/api/experiments", body, content_type="application/json")
    assert resp.status_code in (201, 400), resp.content[:300]
    cfg["reward"]["kwargs"] = {"v": data}
    try:
        text = yaml.safe_dump(cfg)  # .inf / .nan, and "\ud800" / "\0" escapes in double-quoted strings
    except yaml.YAMLError:
        return  # PyYAML cannot write this value; then no client can send it either
    resp = client.post(
        "/api/experiments/import", {"project": project, "name": "fuzz", "yaml": text}, format="json"
    )
    assert resp.status_code in (201, 400), resp.content[:300]
    assert client.get("/api/experiments").status_code == 200


SWEEP_NUMBER = st.one_of(
    st.integers(-(2**80), 2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([2**63, 2**63 - 1, 2**64, -1, 1e308, -1e308, 10**400]),  # column, torch, float edges
)


@FREE_SETTINGS
@given(
    field=st.sampled_from(["seed", "model.tiny.seed", "trainer.total_steps", "algorithm.kl_coef",
                           "resources.cpus_per_actor", "resources.rollout_gpus"]),
    form=st.sampled_from(["grid", "int", "uniform", "loguniform", "text"]),
    low=SWEEP_NUMBER,
    high=SWEEP_NUMBER,
)  # fmt: skip
@example(field="seed", form="grid", low=2**63, high=0)
@example(field="seed", form="text", low=-1e308, high=1e308)
@example(field="algorithm.kl_coef", form="uniform", low=-1e308, high=1e308)
def test_sweep_points_from_any_numbers_are_a_sweep_or_a_400_at_the_space(fuzz_world, field, form, low, high):
    """Search spaces whose numbers overflow a column, torch's seed or a float: a sweep, or a 400 under
    ``search_space``; never a 500."""
    if form == "grid":
        spec, method = [low, high], "grid"
    elif form == "text":
        spec, method = f"int({low}, {high})", "random"
    else:
        spec, method = {form: [low, high]}, "random"
    body = {
        "experiment": fuzz_world["ids"]["experiment"], "metric": "m", "method": method,
        "search_space": {field: spec}, "max_runs": 2,
    }  # fmt: skip
    resp = _api(fuzz_world).post("/api/sweeps", body, format="json")
    assert resp.status_code in (201, 400), resp.content[:300]
    if resp.status_code == 400:
        assert all(k.startswith("search_space") for k in resp.json()["errors"]), resp.json()

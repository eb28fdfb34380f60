"""The platform's half of the seam: the OpenAPI document describes ingestion from the engine's wire models,
a config is validated once on each way to a run, and the run lifecycle reaches the launcher on commit."""

from __future__ import annotations

import pytest
import yaml
from drf_spectacular.generators import SchemaGenerator

from experiments.models import RunState
from experiments.services import run_create, run_request_cancel, run_transition
from launcher.lifecycle import enqueue_cancel
from rl_engine import wire
from rl_engine.config import ExperimentConfig
from tests.factories import demo_config
from tests.platform.conftest import client_for


@pytest.fixture(scope="module")
def openapi() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def _walk(node):
    if isinstance(node, dict):
        yield node
        for key, value in node.items():
            if key != "properties":
                yield from _walk(value)
            else:
                for prop in value.values():
                    yield from _walk(prop)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def test_the_openapi_document_describes_ingestion_from_the_wire_models(openapi):
    schemas = openapi["components"]["schemas"]
    path = openapi["paths"]["/api/runs/{run_id}/metrics"]["post"]
    assert path["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/MetricsBodyRequest"
    }
    points = schemas["MetricsBodyRequest"]["properties"]["points"]
    assert (
        points["maxItems"] == wire.MAX_POINTS_PER_BATCH
        and str(wire.MAX_POINTS_PER_BATCH) in points["description"]
    )
    assert schemas["PointIn"]["additionalProperties"] is False
    assert schemas["EventKind"]["enum"] == [k.value for k in wire.EventKind]
    assert set(schemas["SampleIn"]["properties"]) == set(wire.SampleIn.model_fields)
    assert set(schemas["HeartbeatReply"]["required"]) == {"active", "state"}
    # In the document's dialect (OpenAPI 3.0): nullable, no ``null`` type, no pydantic titles.
    version = schemas["SampleIn"]["properties"]["version_start"]
    assert version["nullable"] is True and version["type"] == "integer" and "anyOf" not in version
    wire_schemas = [schemas[n] for n in ("MetricsBodyRequest", "EventsBodyRequest", "SamplesBodyRequest",
                                         "SampleIn", "EventIn", "PointIn", "MetricsReply", "EventsReply")]  # fmt: skip
    nodes = list(_walk(wire_schemas))
    assert not [n for n in nodes if n.get("type") == "null" or "title" in n]


@pytest.fixture
def validations(monkeypatch):
    """Counts validations of an experiment config with the engine's schema."""
    calls = []
    original = ExperimentConfig.model_validate.__func__

    def counted(cls, *args, **kwargs):
        calls.append(1)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(ExperimentConfig, "model_validate", classmethod(counted))
    return calls


def test_a_config_is_validated_once_on_each_way_to_a_run(team, validations):
    member = client_for(team["member"])
    body = {"project": team["project"].pk, "name": "once", "config": demo_config()}
    text = yaml.safe_dump(demo_config())
    validations.clear()  # the served preset is read with the schema too: not a way in of the user's
    created = member.post("/api/experiments", body, format="json")
    assert created.status_code == 201 and len(validations) == 1  # the serializer; the service trusts it
    launched = member.post("/api/runs", {"experiment": created.json()["id"]}, format="json")
    assert launched.status_code == 201 and len(validations) == 2  # run_create reads the stored row: once more
    imported = member.post(
        "/api/experiments/import",
        {"project": team["project"].pk, "name": "yaml", "yaml": text},
        format="json",
    )
    assert imported.status_code == 201 and len(validations) == 3  # the import; the service trusts it


def test_a_cancel_request_reaches_the_launcher_only_after_commit(
    team, experiment, django_capture_on_commit_callbacks
):
    run = run_create(experiment=experiment, user=None)
    run_transition(run_id=run.pk, to=RunState.STARTING)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert run_request_cancel(run=run, user=team["member"]).state == RunState.CANCELLING
    cancels = [cb for cb in callbacks if getattr(cb, "func", None) is enqueue_cancel]
    assert [cb.args for cb in cancels] == [(run.pk,)]
    statuses = list(run.events.filter(kind="status").values_list("data", flat=True))
    assert statuses[-1] == {"from": "starting", "to": "cancelling"}  # tracking recorded the change

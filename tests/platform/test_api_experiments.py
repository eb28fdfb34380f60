"""Experiments and runs through the REST API: validation with field paths, clone, YAML, launch, filters."""

from __future__ import annotations

import copy

import pytest
import yaml

from experiments.models import Experiment, Run, RunState
from experiments.services import run_transition
from rl_engine.config import names as config_names
from tests.factories import ExperimentFactory, checkpoint_path, demo_config
from tests.platform.conftest import client_for
from tracking.services import checkpoint_record


@pytest.fixture
def member(team):
    return client_for(team["member"])


def create_body(team, **over) -> dict:
    return {
        "project": team["project"].pk,
        "name": "copy-task",
        "description": "d",
        "tags": ["a", "b"],
        "config": demo_config(),
        **over,
    }


@pytest.mark.smoke
def test_create_experiment_stores_the_normalised_config(team, member):
    resp = member.post("/api/experiments", create_body(team), format="json")
    assert resp.status_code == 201, resp.json()
    exp = Experiment.objects.get(pk=resp.json()["id"])
    assert exp.created_by == team["member"] and exp.tags == ["a", "b"]
    assert exp.config["trainer"]["total_steps"] == 3
    assert exp.config["trainer"]["micro_batch_size"] is None  # defaults made explicit
    assert resp.json()["config"] == exp.config


@pytest.mark.smoke
def test_invalid_config_is_a_400_with_pydantic_field_paths(team, member):
    cfg = demo_config()
    cfg["rollout"]["n"] = 7  # batch_size 64 is not a multiple of 7
    cfg["trainer"]["lr"] = -1
    resp = member.post("/api/experiments", create_body(team, config=cfg), format="json")
    assert resp.status_code == 400
    body = resp.json()
    assert body["detail"] == "Invalid input."
    assert "config.trainer.lr" in body["errors"]
    cfg["trainer"]["lr"] = 1e-4
    resp = member.post("/api/experiments", create_body(team, config=cfg), format="json")
    assert resp.status_code == 400
    assert any("rollout.n" in m for m in resp.json()["errors"]["config"])  # a cross-field (root) error


# The reward's choices: the built-ins, then the reward plugins installed here (the example plugin).
REWARD_CHOICES = ", ".join(sorted(config_names.REWARDS.names)) + (
    f"; installed plugins: {', '.join(sorted(config_names.reward_plugins()))}"
    if config_names.reward_plugins()
    else ""
)


@pytest.mark.parametrize(
    ("section", "field", "value", "names"),
    [
        ("reward", "name", "exact_matchh", REWARD_CHOICES),
        ("data", "task", "cpy", "add, add_mod10, copy, next_digit, reverse"),
    ],
)
def test_a_misspelt_registry_name_is_a_400_at_its_field_naming_the_choices(
    team, member, section, field, value, names
):
    # Refused when the experiment is created, not inside the run's job.
    cfg = demo_config()
    cfg[section] = {**cfg.get(section, {}), field: value}
    resp = member.post("/api/experiments", create_body(team, config=cfg), format="json")
    assert resp.status_code == 400, resp.json()
    what = "reward" if section == "reward" else "task"
    assert resp.json()["errors"] == {
        f"config.{section}.{field}": [f"unknown {what} {value!r}; choose one of {names}"]
    }
    assert not Experiment.objects.exists()


def test_a_queue_bound_that_cannot_hold_a_pull_is_a_400_at_its_field(team, member):
    """A cross-section rule whose fix is one field's (the engine used to find it only at launch)."""
    cfg = demo_config()
    cfg["pipeline"]["queue_max_size"] = 8  # one generate call is 8 prompts x rollout.n 8 = 64 samples
    resp = member.post("/api/experiments", create_body(team, config=cfg), format="json")
    assert resp.status_code == 400
    assert list(resp.json()["errors"]) == ["config.pipeline.queue_max_size"]
    assert resp.json()["errors"]["config.pipeline.queue_max_size"][0].startswith(
        "must be 0 or at least 64 samples"
    )
    cfg["pipeline"]["queue_max_size"] = 64
    assert member.post("/api/experiments", create_body(team, config=cfg), format="json").status_code == 201


@pytest.mark.parametrize(
    "body",
    [
        "not json at all",
        "[1, 2]",
        '{"project": "x"}',
        '{"config": {"model": 3}}',
        "null",
        '{"project": 1, "name": "\\u0000", "config": {}}',
        '{"tags": "notalist"}',
    ],
)
def test_malformed_bodies_are_400_never_500(team, member, body):
    resp = member.generic("POST", "/api/experiments", body, content_type="application/json")
    assert resp.status_code == 400, resp.content
    assert "detail" in resp.json()


def test_update_validates_and_runs_keep_their_frozen_config(team, member, experiment):
    run = member.post("/api/runs", {"experiment": experiment.pk}, format="json").json()
    cfg = copy.deepcopy(experiment.config)
    cfg["seed"] = 7
    resp = member.patch(f"/api/experiments/{experiment.pk}", {"config": cfg, "tags": ["x"]}, format="json")
    assert resp.status_code == 200 and resp.json()["config"]["seed"] == 7 and resp.json()["tags"] == ["x"]
    assert Run.objects.get(pk=run["id"]).config["seed"] == 0
    bad = member.patch(f"/api/experiments/{experiment.pk}", {"config": {"model": {}}}, format="json")
    assert bad.status_code == 400 and "config.model.path" in bad.json()["errors"]


def test_clone_copies_config_and_tags_under_a_new_name(team, member, experiment):
    resp = member.post(f"/api/experiments/{experiment.pk}/clone", {}, format="json")
    assert resp.status_code == 201
    assert resp.json()["name"] == f"{experiment.name} (copy)"
    assert resp.json()["config"] == experiment.config and resp.json()["tags"] == experiment.tags
    named = member.post(f"/api/experiments/{experiment.pk}/clone", {"name": "v2"}, format="json")
    assert named.json()["name"] == "v2" and named.json()["id"] != resp.json()["id"]


def test_yaml_export_and_import_round_trip(team, member, experiment):
    resp = member.get(f"/api/experiments/{experiment.pk}/yaml")
    assert resp.status_code == 200 and resp["Content-Type"].startswith("application/yaml")
    text = resp.content.decode()
    assert yaml.safe_load(text) == experiment.config
    imported = member.post(
        "/api/experiments/import",
        {"project": team["project"].pk, "name": "from yaml", "yaml": text},
        format="json",
    )
    assert imported.status_code == 201
    assert imported.json()["config"] == experiment.config
    broken = member.post(
        "/api/experiments/import",
        {"project": team["project"].pk, "name": "x", "yaml": "model: [unclosed"},
        format="json",
    )
    assert broken.status_code == 400 and "line" in broken.json()["errors"]["yaml"][0]
    invalid = member.post(
        "/api/experiments/import",
        {
            "project": team["project"].pk,
            "name": "x",
            "yaml": "model: {path: p}\nrollout: {backend: hf, n: 0}",
        },
        format="json",
    )
    assert invalid.status_code == 400 and "yaml.rollout.n" in invalid.json()["errors"]


def test_schema_and_presets_come_from_the_engine(member):
    schema = member.get("/api/schema/experiment").json()
    assert "model" in schema["properties"] and "rollout" in schema["properties"]
    presets = member.get("/api/presets").json()
    assert "demo-cpu" in presets
    assert member.get("/api/presets/demo-cpu").json()["rollout"]["backend"] == "hf"
    assert member.get("/api/presets/nope").status_code == 404


def test_delete_refuses_an_experiment_with_active_runs(team, member, experiment):
    run = member.post("/api/runs", {"experiment": experiment.pk}, format="json").json()
    assert member.delete(f"/api/experiments/{experiment.pk}").status_code == 409
    run_transition(run_id=run["id"], to=RunState.CANCELLED)
    assert member.delete(f"/api/experiments/{experiment.pk}").status_code == 204
    assert not Experiment.objects.filter(pk=experiment.pk).exists()


@pytest.mark.smoke
def test_launch_creates_a_queued_run_with_the_frozen_config(team, member, experiment):
    resp = member.post("/api/runs", {"experiment": experiment.pk, "priority": 3}, format="json")
    assert resp.status_code == 201
    body = resp.json()
    assert body["state"] == "queued" and body["number"] == 1 and body["priority"] == 3
    assert body["config"] == experiment.config and body["project"] == team["project"].pk


def test_run_list_filters_and_paginates(team, member):
    a = ExperimentFactory(project=team["project"], tags=["sweep"])
    b = ExperimentFactory(project=team["project"], tags=["other"])
    ids = [member.post("/api/runs", {"experiment": e.pk}, format="json").json()["id"] for e in (a, a, b)]
    run_transition(run_id=ids[0], to=RunState.CANCELLED)

    def listed(query: str) -> list[int]:
        resp = member.get(f"/api/runs?{query}")
        assert resp.status_code == 200, resp.json()
        return sorted(r["id"] for r in resp.json()["results"])

    assert listed("tag=sweep") == sorted(ids[:2])
    assert listed("state=queued") == sorted(ids[1:])
    assert listed("state=queued,cancelled&experiment=" + str(a.pk)) == sorted(ids[:2])
    assert listed(f"project={team['project'].pk}") == sorted(ids)
    assert listed(f"project={team['other_project'].pk}") == []
    page = member.get("/api/runs?limit=2&offset=0").json()
    assert page["count"] == 3 and len(page["results"]) == 2 and page["next"]
    assert member.get("/api/runs?state=bogus").status_code == 400
    assert member.get("/api/runs?experiment=abc").status_code == 400


def test_cancel_then_cancel_again_is_a_conflict(team, member, experiment):
    run = member.post("/api/runs", {"experiment": experiment.pk}, format="json").json()
    resp = member.post(f"/api/runs/{run['id']}/cancel")
    assert resp.status_code == 200 and resp.json()["state"] == "cancelled"
    again = member.post(f"/api/runs/{run['id']}/cancel")
    assert again.status_code == 409 and "cancelled" in again.json()["detail"]


def test_resume_creates_a_linked_run_from_the_latest_checkpoint(team, member, experiment):
    run = member.post("/api/runs", {"experiment": experiment.pk}, format="json").json()
    assert member.post(f"/api/runs/{run['id']}/resume", {}, format="json").status_code == 409  # still queued
    run_transition(run_id=run["id"], to=RunState.FAILED, error="oom")
    assert member.post(f"/api/runs/{run['id']}/resume", {}, format="json").status_code == 409  # no checkpoint
    path = checkpoint_path(Run.objects.get(pk=run["id"]), 4)
    ckpt = checkpoint_record(run_id=run["id"], step=4, path=path)
    resp = member.post(f"/api/runs/{run['id']}/resume", {"priority": 9}, format="json")
    assert resp.status_code == 201
    new = resp.json()
    assert new["resumed_from"] == run["id"] and new["resumed_from_checkpoint"] == ckpt.pk
    assert new["config"] == run["config"] and new["priority"] == 9 and new["number"] == 2

"""What a config from the platform may ask of the cluster (docs/api.md, "Trust boundary"): bounded GPUs
and CPUs, custom Ray resources only from the deployment's ALLOWED_NODE_RESOURCES and ``node:*`` never.
Each refusal is a 400 at the field's path through every way a member makes a run's config: create,
fork and sweep."""

from __future__ import annotations

import copy

import pytest

from experiments.models import Experiment, Run
from experiments.services import run_create, run_transition
from sweeps.models import Sweep
from tests.factories import checkpoint_path, demo_config
from tests.platform.conftest import client_for
from tracking.services import checkpoint_record

# (resources section, the path refused, the deployment's settings)
REFUSED = [
    ({"trainer_node_resources": {"node:10.0.0.1": 1}}, "resources.trainer_node_resources", {}),
    ({"rollout_node_resources": {"node:10.0.0.1": 0.01}}, "resources.rollout_node_resources",
     {"ALLOWED_NODE_RESOURCES": ["node:10.0.0.1"]}),  # node:* never, listed or not
    ({"trainer_node_resources": {"team_b_gpus": 1}}, "resources.trainer_node_resources", {}),
    ({"rollout_node_resources": {"rollout_node": 1, "team_b_gpus": 1}}, "resources.rollout_node_resources",
     {"ALLOWED_NODE_RESOURCES": ["rollout_node"]}),
    ({"rollout_gpus": 100_000}, "resources.rollout_gpus", {}),  # the engine's schema: absurd
    ({"rollout_gpus": 2}, "resources.rollout_gpus", {"RUN_MAX_GPUS": 1}),
    ({"trainer_gpus": 5}, "resources.trainer_gpus", {"RUN_MAX_GPUS": 4}),
    ({"cpus_per_actor": 1e300}, "resources.cpus_per_actor", {}),  # the engine's schema
    ({"cpus_per_actor": 65}, "resources.cpus_per_actor", {}),  # RUN_MAX_CPUS_PER_ACTOR, default 64
]  # fmt: skip
ALLOWED = [
    ({"trainer_node_resources": {"trainer_node": 1}, "rollout_node_resources": {"rollout_node": 0.5}},
     {"ALLOWED_NODE_RESOURCES": ["trainer_node", "rollout_node"]}),
    ({"rollout_gpus": 2, "trainer_gpus": 4, "cpus_per_actor": 8}, {"RUN_MAX_GPUS": 4}),
    ({"cpus_per_actor": 64}, {}),
]  # fmt: skip
IDS = [f"{next(iter(r))}={next(iter(r.values()))}" for r, _, _ in REFUSED]


def _config(resources: dict) -> dict:
    cfg = copy.deepcopy(demo_config())
    cfg["resources"] = {**cfg.get("resources", {}), **resources}
    return cfg


def _apply(settings, values: dict) -> None:
    for name, value in values.items():
        setattr(settings, name, value)


@pytest.fixture
def member(team):
    return client_for(team["member"])


@pytest.fixture
def parent(team, experiment):
    run = run_create(experiment=experiment, user=team["member"])
    run_transition(run_id=run.pk, to="failed", error="x")
    checkpoint_record(run_id=run.pk, step=1, path=checkpoint_path(run, 1))
    return run


@pytest.mark.parametrize(("resources", "path", "deployment"), REFUSED, ids=IDS)
def test_create_refuses_the_resources_at_their_path(team, member, settings, resources, path, deployment):
    _apply(settings, deployment)
    body = {"project": team["project"].pk, "name": "x", "config": _config(resources)}
    resp = member.post("/api/experiments", body, format="json")
    assert resp.status_code == 400, resp.content
    assert f"config.{path}" in resp.json()["errors"], resp.json()
    assert not Experiment.objects.filter(name="x").exists()


@pytest.mark.parametrize(("resources", "path", "deployment"), REFUSED, ids=IDS)
def test_fork_refuses_the_resources_at_their_override_path(
    member, parent, settings, resources, path, deployment
):
    _apply(settings, deployment)
    runs = Run.objects.count()
    body = {"config_overrides": {"resources": resources}}
    resp = member.post(f"/api/runs/{parent.pk}/fork", body, format="json")
    assert resp.status_code == 400, resp.content
    assert f"config_overrides.{path}" in resp.json()["errors"], resp.json()
    assert Run.objects.count() == runs


@pytest.mark.parametrize(("resources", "path", "deployment"), REFUSED, ids=IDS)
def test_sweep_refuses_a_point_with_the_resources_at_its_search_path(
    member, experiment, settings, resources, path, deployment
):
    _apply(settings, deployment)
    ((field, value),) = list(resources.items())[:1]
    body = {
        "experiment": experiment.pk,
        "metric": "m",
        "method": "grid",
        "search_space": {f"resources.{field}": [value]},
    }
    resp = member.post("/api/sweeps", body, format="json")
    assert resp.status_code == 400, resp.content
    assert f"search_space.{path}" in resp.json()["errors"], resp.json()
    assert not Sweep.objects.exists()


@pytest.mark.parametrize(("resources", "deployment"), ALLOWED)
def test_what_the_deployment_allows_is_accepted_everywhere(
    team, member, parent, settings, resources, deployment
):
    _apply(settings, deployment)
    body = {"project": team["project"].pk, "name": "ok", "config": _config(resources)}
    assert member.post("/api/experiments", body, format="json").status_code == 201
    fork = {"config_overrides": {"resources": resources}}
    assert member.post(f"/api/runs/{parent.pk}/fork", fork, format="json").status_code == 201
    space = {f"resources.{k}": [v] for k, v in resources.items()}
    sweep = {"experiment": parent.experiment_id, "metric": "m", "method": "grid", "search_space": space}
    assert member.post("/api/sweeps", sweep, format="json").status_code == 201

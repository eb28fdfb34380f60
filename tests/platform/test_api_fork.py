"""Fork a run from one of its checkpoints with a changed config (POST /api/runs/{id}/fork): the merged
config, the checkpoint chosen, the 400s with field paths, 409 for an active parent, the status message."""

from __future__ import annotations

import pytest
from django.test import Client

from experiments.models import Run, RunState
from experiments.run_files import checkpoint_folder, run_folder
from experiments.services import run_create, run_transition
from launcher.services import job_spec, job_spec_file
from rl_engine.cli import load_job
from tests.factories import checkpoint_path
from tests.platform.conftest import client_for
from tracking.models import RunEvent
from tracking.services import checkpoint_record


@pytest.fixture
def member(team):
    return client_for(team["member"])


@pytest.fixture
def parent(team, experiment):
    """A failed run with checkpoints at steps 2 and 4."""
    run = run_create(experiment=experiment, user=team["member"])
    run_transition(run_id=run.pk, to=RunState.FAILED, error="oom")
    for step in (2, 4):
        checkpoint_record(run_id=run.pk, step=step, path=checkpoint_path(run, step))
    return Run.objects.get(pk=run.pk)


def fork(client, run_id: int, body: dict):
    return client.post(f"/api/runs/{run_id}/fork", body, format="json")


@pytest.mark.smoke
def test_fork_queues_a_linked_run_with_the_merged_config_from_the_chosen_checkpoint(team, member, parent):
    at_2 = parent.checkpoints.get(step=2)
    body = {
        "checkpoint": at_2.pk,
        "config_overrides": {"trainer": {"lr": 5e-7, "total_steps": 6}, "algorithm": {"kl_coef": 0.01}},
    }
    resp = fork(member, parent.pk, body)
    assert resp.status_code == 201, resp.json()
    new = Run.objects.get(pk=resp.json()["id"])
    assert new.state == RunState.QUEUED and new.experiment_id == parent.experiment_id
    assert new.resumed_from_id == parent.pk and new.resumed_from_checkpoint_id == at_2.pk
    assert new.created_by == team["member"] and new.provider == parent.provider
    expected = {
        **parent.config,
        "trainer": {**parent.config["trainer"], "lr": 5e-7, "total_steps": 6},
        "algorithm": {**parent.config["algorithm"], "kl_coef": 0.01},
    }
    assert new.config == expected  # the parent's, with only the overrides changed
    assert resp.json()["config"] == expected
    assert Run.objects.get(pk=parent.pk).config == parent.config  # the parent keeps its own
    queued = RunEvent.objects.get(run=new, kind="status")
    assert queued.message == f"queued (resumed from run #{parent.number} at step 2)"


def test_fork_defaults_to_the_latest_checkpoint_and_the_parents_config(member, parent):
    resp = fork(member, parent.pk, {})
    assert resp.status_code == 201, resp.json()
    new = resp.json()
    assert new["resumed_from_checkpoint"] == parent.checkpoints.get(step=4).pk
    assert new["config"] == parent.config


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"trainer": {"lr": -1}}, "config_overrides.trainer.lr"),
        ({"trainer": {"lr": "fast"}}, "config_overrides.trainer.lr"),
        ({"trainer": {"lrr": 1e-6}}, "config_overrides.trainer.lrr"),
        ({"nonsense": {"a": 1}}, "config_overrides.nonsense"),
        ({"model": {"dtype": "bfloat16"}}, "config_overrides.model.dtype"),
        ({"model": {"tiny": {"hidden_size": 128}}}, "config_overrides.model.tiny"),
        ({"pipeline": {"num_rollouters": 2}}, "config_overrides.pipeline.num_rollouters"),
        ({"trainer": {"betas": {"first": 0.5}}}, "config_overrides.trainer.betas"),
        # the platform's policy, at the override that asked for it
        (
            {"logging": {"mlflow": {"tracking_uri": "http://mlflow.example.com"}}},
            "config_overrides.logging.mlflow.tracking_uri",
        ),
        ([1, 2], "config_overrides"),
    ],
)
def test_fork_refuses_bad_overrides_with_their_field_paths(member, parent, overrides, field):
    before = Run.objects.count()
    resp = fork(member, parent.pk, {"config_overrides": overrides})
    assert resp.status_code == 400, resp.json()
    assert field in resp.json()["errors"], resp.json()
    assert Run.objects.count() == before


def test_fork_refuses_a_checkpoint_of_another_run(team, member, experiment, parent):
    other = run_create(experiment=experiment, user=team["member"])
    run_transition(run_id=other.pk, to=RunState.CANCELLED)
    foreign = checkpoint_record(run_id=other.pk, step=7, path=checkpoint_path(other, 7))
    for ckpt in (foreign.pk, 10**9):
        resp = fork(member, parent.pk, {"checkpoint": ckpt, "config_overrides": {"trainer": {"lr": 1e-6}}})
        assert resp.status_code == 400 and list(resp.json()["errors"]) == ["checkpoint"], resp.json()
        assert "is not one of run" in resp.json()["errors"]["checkpoint"][0]
    assert fork(member, parent.pk, {"checkpoint": 0}).status_code == 400


def test_fork_of_an_active_run_or_one_without_checkpoints_is_a_conflict(team, member, experiment):
    run = run_create(experiment=experiment, user=team["member"])
    resp = fork(member, run.pk, {"config_overrides": {"trainer": {"lr": 1e-6}}})
    assert resp.status_code == 409 and "queued" in resp.json()["detail"]
    run_transition(run_id=run.pk, to=RunState.FAILED, error="x")
    resp = fork(member, run.pk, {})
    assert resp.status_code == 409 and "no checkpoint" in resp.json()["detail"]


def test_fork_needs_a_member_of_the_runs_project(team, parent):
    assert fork(client_for(team["viewer"]), parent.pk, {}).status_code == 403
    assert fork(client_for(team["stranger"]), parent.pk, {}).status_code == 404
    assert fork(client_for(), parent.pk, {}).status_code in (401, 403)
    assert Run.objects.filter(resumed_from=parent).count() == 0


def test_fork_is_in_the_openapi_document(db):
    schema = Client().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    doc = schema.json()
    op = doc["paths"]["/api/runs/{id}/fork"]["post"]
    assert {"201", "400", "409"} <= set(op["responses"])
    body = doc["components"]["schemas"][
        op["requestBody"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]
    ]
    assert {"checkpoint", "config_overrides", "priority"} <= set(body["properties"])


def test_the_chosen_checkpoint_is_the_one_the_launchers_job_spec_resumes_from(team, member, parent):
    """For each checkpoint a fork may choose (and none: the latest), the job spec the launcher builds and
    writes for the fork, as the engine's CLI reads it back, resumes from exactly that checkpoint: the
    rule written out here (the chosen one, else the parent's highest step), not the launcher's. No
    engine runs."""
    checkpoint_record(run_id=parent.pk, step=3, path=checkpoint_path(parent, 3))  # not in step order
    checkpoints = list(parent.checkpoints.order_by("pk"))
    assert [c.step for c in checkpoints] == [2, 4, 3]
    for chosen in [*checkpoints, None]:
        body = {"checkpoint": chosen.pk} if chosen is not None else {}
        resp = fork(member, parent.pk, {**body, "config_overrides": {"trainer": {"lr": 5e-7}}})
        assert resp.status_code == 201, resp.json()
        new = Run.objects.get(pk=resp.json()["id"])
        want = chosen if chosen is not None else max(checkpoints, key=lambda c: c.step)
        spec = job_spec(new, run_folder(new) / "token")
        assert spec.placement.resume_from == want.path, (chosen, spec.placement.resume_from)
        read = load_job(str(job_spec_file(spec, new)), [], {})  # what the job starts with
        assert read.placement.resume_from == want.path and read.config.trainer.lr == 5e-7
        assert read.placement.checkpoint_dir == str(checkpoint_folder(new)) != str(checkpoint_folder(parent))

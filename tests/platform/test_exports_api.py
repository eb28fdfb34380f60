"""Checkpoint export requests through the REST API: who may ask, what is recorded, idempotence, and how the
state is read back from the run's events. (The export job itself: tests/launcher/test_exports.py.)"""

from __future__ import annotations

import pytest

from experiments.services import run_create
from launcher import exports
from tests.factories import ExperimentFactory
from tests.platform.conftest import client_for
from tracking.models import RunEvent
from tracking.services import checkpoint_record, events_append


@pytest.fixture
def run_with_checkpoint(team, monkeypatch):
    enqueued: list[tuple] = []
    monkeypatch.setattr(exports, "_enqueue", lambda *args: enqueued.append(args))  # no worker in these tests
    run = run_create(experiment=ExperimentFactory(project=team["project"]), user=team["member"])
    checkpoint_record(run_id=run.pk, step=20, path="/var/runs/r1/checkpoints/step_00000020", size_bytes=10)
    return run, enqueued


@pytest.mark.django_db(transaction=True)  # the task is enqueued on commit
def test_a_member_queues_an_export_and_the_request_is_a_run_event(team, run_with_checkpoint):
    run, enqueued = run_with_checkpoint
    resp = client_for(team["member"]).post(f"/api/runs/{run.pk}/checkpoints/20/export")
    assert resp.status_code == 202, resp.json()
    body = resp.json()
    assert body["state"] == "queued" and body["step"] == 20 and body["by"] == "member"
    assert body["checkpoint"] == "/var/runs/r1/checkpoints/step_00000020"
    assert body["out"] == "/var/runs/r1/checkpoints/hf/step_00000020"  # outside what pruning deletes
    ev = RunEvent.objects.get(run=run, data__source="export")
    assert ev.kind == "log" and ev.message == "export of the step 20 checkpoint queued"
    assert enqueued == [(run.pk, 20, ev.seq)] and body["request_seq"] == ev.seq
    # asking again while it is queued returns the same request instead of a second job
    again = client_for(team["member"]).post(f"/api/runs/{run.pk}/checkpoints/20/export").json()
    assert again["request_seq"] == ev.seq and len(enqueued) == 1


@pytest.mark.django_db(transaction=True)
def test_the_export_list_follows_the_latest_event_per_checkpoint(team, run_with_checkpoint):
    run, enqueued = run_with_checkpoint
    client_for(team["member"]).post(f"/api/runs/{run.pk}/checkpoints/20/export")
    seq = enqueued[0][2]
    events_append(run_id=run.pk, kind="log", message="exporting", data={"source": "export", "step": 20,
                  "state": "running", "job_id": "rlp-run-1-export-20"})  # fmt: skip
    events_append(run_id=run.pk, kind="log", message="exported", data={"source": "export", "step": 20,
                  "state": "failed", "error": "disk full"})  # fmt: skip
    [record] = client_for(team["viewer"]).get(f"/api/runs/{run.pk}/exports").json()
    assert (record["state"], record["error"], record["job_id"], record["request_seq"]) == (
        "failed", "disk full", "rlp-run-1-export-20", seq)  # fmt: skip
    # a failed export can be asked for again: a new request (and a new Ray job id)
    retry = client_for(team["member"]).post(f"/api/runs/{run.pk}/checkpoints/20/export").json()
    assert retry["state"] == "queued" and retry["request_seq"] > seq and retry["error"] == ""
    assert len(enqueued) == 2
    assert exports.export_run(run_id=run.pk, step=20, request_seq=seq) == "superseded"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("role", "method", "path", "status"),
    [
        ("viewer", "post", "checkpoints/20/export", 403),
        ("stranger", "post", "checkpoints/20/export", 404),
        ("anonymous", "post", "checkpoints/20/export", 401),
        ("member", "post", "checkpoints/21/export", 404),  # no checkpoint at that step
        ("viewer", "get", "exports", 200),
        ("stranger", "get", "exports", 404),
        ("anonymous", "get", "exports", 401),
    ],
)
def test_export_endpoints_follow_the_permission_policy(team, run_with_checkpoint, role, method, path, status):
    run, enqueued = run_with_checkpoint
    client = client_for(team[role]) if role != "anonymous" else client_for()
    resp = getattr(client, method)(f"/api/runs/{run.pk}/{path}")
    assert resp.status_code == status, resp.content[:300]
    if status >= 400:
        assert not RunEvent.objects.filter(run=run, data__source="export").exists() and not enqueued
    if status == 404 and role == "member":
        assert resp.json()["detail"] == f"run {run.pk} has no checkpoint at step 21"

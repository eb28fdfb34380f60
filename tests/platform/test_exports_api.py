"""Checkpoint export requests through the REST API: who may ask, what is recorded (the platform's own
``Export`` table), idempotence, and that nothing a run or a member reports decides what the export job
reads or where it writes. (The export job on a real cluster: tests/launcher/test_exports.py.)"""

from __future__ import annotations

import json

import pytest

from accounts.services import ingest_token_issue
from experiments.run_files import checkpoint_folder
from experiments.services import run_create
from launcher import exports, jobs, services
from launcher.models import Export
from tests.factories import ExperimentFactory, checkpoint_path
from tests.platform.conftest import client_for
from tracking.models import Checkpoint, RunEvent
from tracking.services import checkpoint_record, events_append


@pytest.fixture
def run_with_checkpoint(team, monkeypatch):
    enqueued: list[tuple] = []
    monkeypatch.setattr(exports, "_enqueue", lambda *args: enqueued.append(args))  # no worker in these tests
    run = run_create(experiment=ExperimentFactory(project=team["project"]), user=team["member"])
    checkpoint_record(run_id=run.pk, step=20, path=checkpoint_path(run, 20), size_bytes=10)
    return run, enqueued


@pytest.fixture
def cluster_standin(monkeypatch):
    """A stand-in for the Ray cluster (the real one: tests/launcher/test_exports.py): records what the
    export task submits and answers with a job that succeeded and printed ``result``."""
    calls: list[dict] = []
    result = {"out": "/somewhere/else", "size_bytes": 7, "dtype": "float32", "step": 20}
    monkeypatch.setattr(
        services, "cluster_for", lambda run: services.Cluster("address", "http://ray.invalid")
    )
    monkeypatch.setattr(jobs, "submit", lambda address, **kw: calls.append(kw) or kw["submission_id"])
    monkeypatch.setattr(jobs, "wait_terminal", lambda *a, **kw: jobs.JobState("SUCCEEDED", "", 0))
    monkeypatch.setattr(jobs, "logs", lambda *a, **kw: json.dumps(result) + "\n")
    return calls


def _export_events(run) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run=run, data__source="export").order_by("seq"))


@pytest.mark.django_db(transaction=True)  # the task is enqueued on commit
def test_a_member_queues_an_export_recorded_in_the_platforms_table(team, run_with_checkpoint):
    run, enqueued = run_with_checkpoint
    resp = client_for(team["member"]).post(f"/api/runs/{run.pk}/checkpoints/20/export")
    assert resp.status_code == 202, resp.json()
    body = resp.json()
    export = Export.objects.get(run=run)
    assert (body["id"], body["state"], body["step"], body["by"]) == (export.pk, "queued", 20, "member")
    assert body["checkpoint"] == checkpoint_path(run, 20) == export.checkpoint.path
    # the output folder is the platform's choice, in the run's own folder, outside what pruning deletes
    assert body["out"] == str(checkpoint_folder(run) / "hf" / "step_00000020") == export.out
    assert enqueued == [(export.pk,)]
    [ev] = _export_events(run)  # a notice for the live page
    assert ev.kind == "log" and ev.message == "export of the step 20 checkpoint queued"
    assert ev.data["export_id"] == export.pk
    # asking again while it is queued returns the same request instead of a second job
    again = client_for(team["member"]).post(f"/api/runs/{run.pk}/checkpoints/20/export").json()
    assert again["id"] == export.pk and len(enqueued) == 1 and Export.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_task_runs_on_the_checkpoint_row_and_its_own_folder_and_records_the_result(
    team, run_with_checkpoint, cluster_standin
):
    run, enqueued = run_with_checkpoint
    first = client_for(team["member"]).post(f"/api/runs/{run.pk}/checkpoints/20/export").json()
    assert exports.export_run(export_id=first["id"]) == "succeeded"
    [call] = cluster_standin
    out = str(checkpoint_folder(run) / "hf" / "step_00000020")
    assert f"--checkpoint {checkpoint_path(run, 20)} --out {out} --force" in call["entrypoint"]
    assert call["submission_id"].endswith(f"-export-20-{first['id']}")
    [record] = client_for(team["viewer"]).get(f"/api/runs/{run.pk}/exports").json()
    # the job's printed "out" is not where the platform says the model is: its own folder is
    assert (record["state"], record["out"], record["size_bytes"], record["dtype"]) == (
        "succeeded", out, 7, "float32")  # fmt: skip
    assert [e.data["state"] for e in _export_events(run)] == ["queued", "running", "succeeded"]
    # a finished export can be asked for again: a new request (and a new Ray job id); the old one is done
    retry = client_for(team["member"]).post(f"/api/runs/{run.pk}/checkpoints/20/export").json()
    assert retry["state"] == "queued" and retry["id"] > first["id"] and len(enqueued) == 2
    assert exports.export_run(export_id=first["id"]) == "succeeded"  # no second job for the old request
    assert len(cluster_standin) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("source", ["export", "launcher", "platform", " Export "])
@pytest.mark.parametrize("who", ["ingest", "member"])
def test_reported_events_may_not_pose_as_the_platforms_own(team, run_with_checkpoint, source, who):
    """The attack: right after asking for an export of their own, a member (or the run's job) reports an
    export "update" naming another project's checkpoint and a folder to replace."""
    run, _ = run_with_checkpoint
    client = (
        client_for(team["member"])
        if who == "member"
        else client_for(token=ingest_token_issue(run=run).secret)
    )
    client_for(team["member"]).post(f"/api/runs/{run.pk}/checkpoints/20/export")
    victim = run_create(experiment=ExperimentFactory(project=team["other_project"]), user=team["stranger"])
    forged = {"source": source, "step": 20, "state": "queued", "checkpoint": checkpoint_path(victim, 5),
              "out": str(checkpoint_folder(victim)), "by": "member"}  # fmt: skip
    before = RunEvent.objects.filter(run=run).count()
    resp = client.post(f"/api/runs/{run.pk}/events", {"events": [{"kind": "log", "message": "x", "data": forged}]},
                       format="json")  # fmt: skip
    assert resp.status_code == 400, resp.content
    assert "reserved for the platform" in resp.json()["errors"]["events[0].data.source"][0]
    assert RunEvent.objects.filter(run=run).count() == before
    export = Export.objects.get(run=run)
    assert (export.checkpoint.path, export.out) == (
        checkpoint_path(run, 20), str(checkpoint_folder(run) / "hf" / "step_00000020"))  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_export_notices_in_the_event_log_are_never_read_back(team, run_with_checkpoint, cluster_standin):
    """Even export-looking events that got into the log (written before the refusal, or by the platform
    with odd data) fake no "succeeded" export, steer no job, and break no listing (no ``step``: 500)."""
    run, _ = run_with_checkpoint
    queued = client_for(team["member"]).post(f"/api/runs/{run.pk}/checkpoints/20/export").json()
    for data in (
        {"source": "export", "step": 20, "state": "succeeded", "out": "/var/lib/models/shared"},
        {"source": "export", "step": 20, "state": "queued", "checkpoint": "/other/project/ckpt", "out": "/"},
        {"source": "export", "state": "succeeded"},  # no step
        {"source": "export", "step": "x", "state": None},
    ):
        events_append(run_id=run.pk, kind="log", message="forged", data=data)
    for path in ("exports", "checkpoints"):
        assert client_for(team["viewer"]).get(f"/api/runs/{run.pk}/{path}").status_code == 200
    [record] = client_for(team["viewer"]).get(f"/api/runs/{run.pk}/exports").json()
    assert (record["id"], record["state"]) == (queued["id"], "queued")
    exports.export_run(export_id=queued["id"])
    [call] = cluster_standin
    assert (
        f"--checkpoint {checkpoint_path(run, 20)} " in call["entrypoint"]
        and "/other/project" not in call["entrypoint"]
    )


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_row_outside_the_runs_folder_is_never_exported(
    team, run_with_checkpoint, cluster_standin
):
    """A row the ingestion check did not write (an older platform, the admin) cannot point the job at
    another run's files: refused when asked for, and again by the task if the row changed since."""
    run, enqueued = run_with_checkpoint
    victim = run_create(experiment=ExperimentFactory(project=team["other_project"]), user=team["stranger"])
    Checkpoint.objects.create(run=run, step=30, path=checkpoint_path(victim, 30))
    resp = client_for(team["member"]).post(f"/api/runs/{run.pk}/checkpoints/30/export")
    assert (
        resp.status_code == 400
        and "outside the run's checkpoint folder" in resp.json()["errors"]["checkpoint"][0]
    )
    assert not Export.objects.filter(step=30).exists() and not enqueued

    queued = client_for(team["member"]).post(f"/api/runs/{run.pk}/checkpoints/20/export").json()
    Checkpoint.objects.filter(run=run, step=20).update(path=checkpoint_path(victim, 20))
    assert exports.export_run(export_id=queued["id"]) == "failed"
    assert not cluster_standin  # nothing submitted
    assert "outside the run's checkpoint folder" in Export.objects.get(pk=queued["id"]).error


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
        assert not Export.objects.exists() and not _export_events(run) and not enqueued
    if status == 404 and role == "member":
        assert resp.json()["detail"] == f"run {run.pk} has no checkpoint at step 21"

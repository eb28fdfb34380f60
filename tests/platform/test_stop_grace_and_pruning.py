"""What a cancel waits for and what it keeps: the engine's reported stop grace (bounded by the operator's
floor and maximum), and checkpoints the engine pruned (listed as removed; no export, resume or fork)."""

from __future__ import annotations

import pytest

from accounts.services import ingest_token_issue
from experiments.models import Run, RunState
from experiments.services import run_create, run_transition
from launcher.supervisor import cancel_grace_s, cancel_kept
from tests.factories import checkpoint_path
from tests.platform.conftest import client_for
from tracking.models import Checkpoint


@pytest.fixture
def run(team, experiment):
    return run_create(experiment=experiment, user=team["member"])


@pytest.fixture
def engine(run):
    return client_for(token=ingest_token_issue(run=run).secret)


def checkpoint_event(run, step: int, pruned: list[int]) -> dict:
    return {
        "kind": "checkpoint",
        "message": f"checkpoint at step {step}",
        "data": {"step": step, "path": checkpoint_path(run, step), "size_bytes": 10,
                 "pruned": [checkpoint_path(run, s) for s in pruned]},
    }  # fmt: skip


def post_events(engine, run, *events: dict):
    return engine.post(f"/api/runs/{run.pk}/events", {"events": list(events)}, format="json")


def test_checkpoints_the_engine_pruned_are_listed_as_removed_and_offer_nothing(team, run, engine):
    """keep_checkpoints 2 over steps 10..40 (the engine's events, in order): 10 and 20 are gone from disk."""
    for step, pruned in [(10, []), (20, []), (30, [10]), (40, [20])]:
        assert post_events(engine, run, checkpoint_event(run, step, pruned)).status_code == 201
    member = client_for(team["member"])
    listed = member.get(f"/api/runs/{run.pk}/checkpoints").json()
    assert {c["step"]: c["pruned"] for c in listed} == {10: True, 20: True, 30: False, 40: False}

    export = member.post(f"/api/runs/{run.pk}/checkpoints/10/export")
    assert export.status_code == 400 and "removed by the engine" in export.json()["errors"]["checkpoint"][0]
    assert member.post(f"/api/runs/{run.pk}/checkpoints/30/export").status_code == 202

    run_transition(run_id=run.pk, to=RunState.FAILED, error="oom")
    at_20 = Checkpoint.objects.get(run=run, step=20)
    fork = member.post(f"/api/runs/{run.pk}/fork", {"checkpoint": at_20.pk}, format="json")
    assert fork.status_code == 400 and "removed by the engine" in str(fork.json())
    resumed = member.post(f"/api/runs/{run.pk}/resume", {}, format="json")
    assert resumed.status_code == 201, resumed.json()
    assert resumed.json()["resumed_from_checkpoint"] == Checkpoint.objects.get(run=run, step=40).pk
    assert cancel_kept(run.pk) == "checkpoint at step 40 kept"


def test_a_run_whose_every_checkpoint_was_pruned_keeps_nothing(run, engine):
    post_events(engine, run, checkpoint_event(run, 10, []))
    Checkpoint.objects.filter(run=run).update(pruned_at="2026-12-07T00:00:00Z")
    assert cancel_kept(run.pk) == "no checkpoint kept"


def test_the_cancel_grace_follows_the_engines_report_within_the_operators_bounds(run, engine, settings):
    settings.RUN_CANCEL_GRACE_S, settings.RUN_CANCEL_GRACE_MAX_S = 5, 120
    assert cancel_grace_s(Run.objects.get(pk=run.pk)) == 5  # nothing reported: the floor
    status = {"kind": "status", "message": "a graceful stop needs about 75 s", "data": {"stop_grace_s": 75.0}}
    assert post_events(engine, run, status).status_code == 201
    assert Run.objects.get(pk=run.pk).stop_grace_s == 75.0
    assert cancel_grace_s(Run.objects.get(pk=run.pk)) == 75.0
    status["data"] = {"stop_grace_s": 900.0}
    post_events(engine, run, status)
    assert cancel_grace_s(Run.objects.get(pk=run.pk)) == 120  # the operator's maximum
    status["data"] = {"stop_grace_s": 1.0}
    post_events(engine, run, status)
    assert cancel_grace_s(Run.objects.get(pk=run.pk)) == 5


@pytest.mark.parametrize("bad", [0, -3, "75", None, 10**9, [1]])
def test_a_malformed_stop_grace_is_a_400_naming_the_field(run, engine, bad):
    status = {"kind": "status", "message": "x", "data": {"stop_grace_s": bad}}
    resp = post_events(engine, run, status)
    assert resp.status_code == 400 and "events[0].data.stop_grace_s" in resp.json()["errors"], resp.json()
    assert Run.objects.get(pk=run.pk).stop_grace_s is None

"""Run lifecycle: launch freezes the config, the one transition service enforces legal moves with CAS."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from experiments.models import Run, RunState
from experiments.services import (
    InvalidTransition,
    NoCheckpoint,
    experiment_update,
    run_create,
    run_heartbeat,
    run_request_cancel,
    run_resume,
    run_transition,
)
from launcher.lifecycle import enqueue_start
from rl_engine.config import parse_config
from tests.factories import RunFactory, checkpoint_path
from tracking.models import RunEvent
from tracking.services import checkpoint_record


@pytest.mark.smoke
def test_run_create_freezes_config_numbers_runs_and_logs_queued(team, experiment):
    first = run_create(experiment=experiment, user=team["member"])
    experiment_update(experiment=experiment, config=parse_config({**experiment.config, "seed": 99}))
    second = run_create(experiment=experiment, user=team["member"], priority=5)
    assert (first.number, second.number) == (1, 2)
    assert first.config["seed"] == 0 and second.config["seed"] == 99
    assert first.state == RunState.QUEUED and first.queued_at is not None
    assert second.priority == 5 and second.project_id == team["project"].pk
    assert list(first.events.values_list("seq", "kind", "data")) == [
        (1, "status", {"from": None, "to": "queued"})
    ]


def test_run_create_enqueues_start_only_after_commit(team, experiment, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run = run_create(experiment=experiment, user=team["member"])
    # The start task must not be sent before the run row is committed (a worker would not find it).
    starts = [cb for cb in callbacks if getattr(cb, "func", None) is enqueue_start]
    assert [cb.args for cb in starts] == [(run.pk,)]


@pytest.mark.smoke
def test_transitions_follow_the_state_machine_and_set_timestamps(team, experiment):
    run = run_create(experiment=experiment, user=None)
    run = run_transition(
        run_id=run.pk, to=RunState.STARTING, from_states={RunState.QUEUED}, ray_job_id="job-1"
    )
    assert run.ray_job_id == "job-1" and run.started_at is None
    run = run_transition(run_id=run.pk, to=RunState.RUNNING)
    assert run.started_at is not None
    run = run_transition(run_id=run.pk, to=RunState.FAILED, error="driver died")
    assert run.finished_at is not None and run.error == "driver died"
    with pytest.raises(InvalidTransition, match="from failed to running"):
        run_transition(run_id=run.pk, to=RunState.RUNNING)
    statuses = list(run.events.filter(kind="status").values_list("data__to", flat=True))
    assert statuses == ["queued", "starting", "running", "failed"]
    assert list(run.events.values_list("seq", flat=True)) == [1, 2, 3, 4]


def test_from_states_narrows_the_allowed_sources(team, experiment):
    run = run_create(experiment=experiment, user=None)
    with pytest.raises(InvalidTransition):
        # cancelled is legal from queued in general, but this caller only accepts running runs.
        run_transition(run_id=run.pk, to=RunState.CANCELLED, from_states={RunState.RUNNING})
    assert Run.objects.get(pk=run.pk).state == RunState.QUEUED


def test_transition_refuses_unknown_fields_and_states(team, experiment):
    run = run_create(experiment=experiment, user=None)
    with pytest.raises(TypeError):
        run_transition(run_id=run.pk, to=RunState.STARTING, state="running")
    with pytest.raises(ValueError):
        run_transition(run_id=run.pk, to="exploded")


def test_cancel_of_a_queued_run_is_immediate_and_of_a_running_run_goes_through_cancelling(team, experiment):
    queued = run_create(experiment=experiment, user=None)
    assert run_request_cancel(run=queued, user=team["member"]).state == RunState.CANCELLED
    running = run_create(experiment=experiment, user=None)
    run_transition(run_id=running.pk, to=RunState.STARTING)
    run_transition(run_id=running.pk, to=RunState.RUNNING)
    cancelling = run_request_cancel(run=running, user=team["member"])
    assert cancelling.state == RunState.CANCELLING and cancelling.cancel_requested_at is not None
    assert run_request_cancel(run=running, user=team["member"]).state == RunState.CANCELLING  # idempotent
    run_transition(run_id=running.pk, to=RunState.CANCELLED)
    with pytest.raises(InvalidTransition):
        run_request_cancel(run=running, user=team["member"])


def test_heartbeat_only_counts_for_active_runs(team, experiment):
    run = run_create(experiment=experiment, user=None)
    assert run_heartbeat(run_id=run.pk) is True
    assert Run.objects.get(pk=run.pk).heartbeat_at is not None
    run_transition(run_id=run.pk, to=RunState.CANCELLED)
    assert run_heartbeat(run_id=run.pk) is False


def test_resume_links_the_new_run_to_the_latest_checkpoint(team, experiment):
    old = run_create(experiment=experiment, user=None)
    run_transition(run_id=old.pk, to=RunState.STARTING)
    run_transition(run_id=old.pk, to=RunState.RUNNING)
    with pytest.raises(InvalidTransition):
        run_resume(run=old, user=None)  # still running
    run_transition(run_id=old.pk, to=RunState.FAILED, error="preempted")
    old.refresh_from_db()
    with pytest.raises(NoCheckpoint, match="no checkpoint"):
        run_resume(run=old, user=None)
    checkpoint_record(run_id=old.pk, step=10, path=checkpoint_path(old, 10))
    latest = checkpoint_record(run_id=old.pk, step=20, path=checkpoint_path(old, 20), size_bytes=123)
    new = run_resume(run=old, user=team["member"])
    assert new.resumed_from_id == old.pk and new.resumed_from_checkpoint_id == latest.pk
    assert new.config == old.config  # where it resumes from is the launcher's placement, not the config


@pytest.mark.django_db(transaction=True)
def test_concurrent_transitions_let_exactly_one_writer_win(team, experiment):
    """Four workers race to cancel the same running run: CAS lets one through, the others get an error.

    Not a queued run: a launcher worker still running (another suite's) may run a late task, and each one
    admits queued runs; only the periodic sweep (which no test schedules here) looks at running ones."""
    run = RunFactory(experiment=experiment, state=RunState.RUNNING)
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def start() -> None:
        barrier.wait()
        try:
            run_transition(run_id=run.pk, to=RunState.CANCELLING, from_states={RunState.RUNNING})
            outcomes.append("won")
        except InvalidTransition:
            outcomes.append("lost")
        finally:
            connection.close()

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["lost", "lost", "lost", "won"]
    assert RunEvent.objects.filter(run=run, kind="status", data__to="cancelling").count() == 1

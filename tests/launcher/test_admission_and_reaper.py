"""Launcher rules on the real database, without a cluster: admission order and limits, the reaper,
orphan detection, and reading the engine's error out of a job log."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from experiments.models import Run
from launcher import jobs, services, supervisor
from launcher.models import Supervision
from tests.factories import ProjectFactory, RunFactory

pytestmark = pytest.mark.django_db


def states(*runs: Run) -> list[str]:
    return [Run.objects.get(pk=r.pk).state for r in runs]


def test_admission_starts_queued_runs_in_priority_order_up_to_the_global_limit(settings):
    settings.RUN_CONCURRENCY_LIMIT = 2
    settings.RUN_CONCURRENCY_LIMIT_PER_PROJECT = 0
    low = RunFactory(priority=0)
    high = RunFactory(priority=10)
    mid_old = RunFactory(priority=5)
    mid_new = RunFactory(priority=5)
    assert services.runs_admit() == [high.pk, mid_old.pk]
    assert states(low, high, mid_old, mid_new) == ["queued", "starting", "starting", "queued"]
    assert services.runs_admit() == []  # full: nothing more starts
    Run.objects.filter(pk=high.pk).update(state="succeeded")
    assert services.runs_admit() == [mid_new.pk]  # a freed slot goes to the next in priority order


def test_a_project_at_its_cap_does_not_block_other_projects(settings):
    settings.RUN_CONCURRENCY_LIMIT = 10
    settings.RUN_CONCURRENCY_LIMIT_PER_PROJECT = 1
    busy_project = ProjectFactory()
    RunFactory(experiment__project=busy_project, state="running")
    waiting = RunFactory(experiment__project=busy_project, priority=100)
    other = RunFactory(priority=0)
    assert services.runs_admit() == [other.pk]
    assert states(waiting, other) == ["queued", "starting"]


def test_admission_reserves_the_launch_for_the_next_task():
    run = RunFactory()
    services.runs_admit()
    sup = Supervision.objects.get(run_id=run.pk)
    assert sup.owner == "" and sup.lease_until > timezone.now()
    assert services.lease_acquire(run_id=run.pk, owner="a", seconds=30)
    assert not services.lease_acquire(run_id=run.pk, owner="b", seconds=30)  # held by a
    assert services.lease_acquire(run_id=run.pk, owner="a", seconds=30)  # idempotent for its owner


def test_reaper_fails_runs_whose_heartbeat_is_too_old_with_a_reason(settings):
    settings.RUN_HEARTBEAT_TIMEOUT_S = 60
    now = timezone.now()
    silent = RunFactory(
        state="running",
        started_at=now - timedelta(minutes=5),
        heartbeat_at=now - timedelta(seconds=61),
        ray_job_id="rlp-gone",
        cluster_address="http://127.0.0.1:9",
    )  # nothing listens there
    alive = RunFactory(
        state="running", started_at=now - timedelta(minutes=5), heartbeat_at=now - timedelta(seconds=5)
    )
    assert supervisor.reap_silent() == [silent.pk]
    silent.refresh_from_db()
    assert silent.state == "failed"
    assert "no heartbeat for over 60 s" in silent.error
    assert states(alive) == ["running"]


def test_sweep_hands_runs_without_a_live_supervisor_to_a_new_one_once():
    run = RunFactory(state="running", heartbeat_at=timezone.now())
    starting = RunFactory(state="starting")
    Supervision.objects.create(
        run=run, owner="dead-worker", lease_until=timezone.now() - timedelta(seconds=1)
    )
    result = supervisor.sweep()
    assert result.to_supervise == [run.pk]
    assert result.to_start == [starting.pk]  # a launch whose task vanished is retried (same job id)
    assert supervisor.sweep().to_supervise == []  # reserved: not enqueued twice
    assert Supervision.objects.get(run_id=run.pk).owner == ""


def test_error_text_is_the_last_traceback_of_the_job_log():
    log = "\n".join([
        "step 1 | reward 0", "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
        "ValueError: first", "retrying", "Traceback (most recent call last):",
        *[f'  File "y.py", line {i}, in f' for i in range(30)], "RuntimeError: the real cause",
    ])  # fmt: skip
    error = jobs.error_from_logs(log)
    assert error.startswith("Traceback (most recent call last):")
    assert error.endswith("RuntimeError: the real cause")
    assert "ValueError" not in error and len(error.splitlines()) <= 15


def test_error_text_without_traceback_is_the_clis_error_line():
    log = "Connecting to existing Ray cluster\nerror: model.path '/x' has no config.json\n"
    assert jobs.error_from_logs(log) == "error: model.path '/x' has no config.json"
    assert jobs.error_from_logs("", fallback="Job failed: exit code 137") == "Job failed: exit code 137"


def test_submission_id_is_stable_for_a_run_and_differs_between_runs():
    a, b = RunFactory(), RunFactory()
    assert services.submission_id_for(a) == services.submission_id_for(Run.objects.get(pk=a.pk))
    assert services.submission_id_for(a) != services.submission_id_for(b)


def test_log_lines_lose_terminal_colour_codes():
    assert jobs.clean_log_line("\x1b[36m(Rollouter pid=1)\x1b[0m warning\r\n") == "(Rollouter pid=1) warning"

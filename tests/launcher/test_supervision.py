"""Supervision on the real stack's Ray head and web server:

- a deadlocked engine is found and stopped: its sink keeps heartbeating (and its supervisor, while the
  Ray job exists), so the heartbeat cannot tell; no progress for RUN_STALL_TIMEOUT_S can. The engine is a
  stand-in that hangs on purpose (a real engine cannot be made to deadlock on demand): a real Ray job
  reporting through the real HTTP sink, then blocking;
- a long job log is streamed, each character once, not re-read at every poll;
- a launch that fails after Ray accepted the job stops that job."""

from __future__ import annotations

import shlex
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.services import ingest_token_issue
from experiments.models import Run
from launcher import jobs, ray_local, services, supervisor
from launcher.models import Supervision
from tests.conftest import REPO_ROOT, wait_for
from tests.factories import ExperimentFactory, RunFactory
from tests.launcher.engine_runs import tiny_config
from tracking.models import RunProgress
from tracking.services import progress_record

pytestmark = pytest.mark.django_db(transaction=True)

HUNG_ENGINE = """
import sys, threading
sys.path.insert(0, {repo!r})
from rl_engine.sinks.http import HttpSink
sink = HttpSink.from_env()
sink.log_event("status", "pipeline running from step 0")
sink.log_metrics(1, {{"reward/mean": 0.0}})
print("stand-in engine: deadlocked on purpose", flush=True)
threading.Event().wait()  # the main thread hangs for good; the sink's heartbeat thread goes on
"""


def test_an_engine_that_hangs_is_failed_after_the_stall_timeout_and_its_job_stopped(
    launcher_stack, settings, tmp_path
):
    head = ray_local.ensure_started()
    now = timezone.now()
    sid = f"rlp-stall-{time.time_ns()}"
    run = RunFactory(state="running", started_at=now, heartbeat_at=now, ray_job_id=sid,
                     cluster_address=head.dashboard_url)  # fmt: skip
    env = {"RL_ENGINE_INGEST_URL": launcher_stack.web.url, "RL_ENGINE_INGEST_TOKEN": ingest_token_issue(run=run).secret,
           "RL_ENGINE_RUN_ID": str(run.pk), "RL_ENGINE_HEARTBEAT_S": "0.5", "RL_ENGINE_SPOOL_DIR": str(tmp_path)}  # fmt: skip
    code = HUNG_ENGINE.format(repo=str(REPO_ROOT))
    jobs.submit(head.dashboard_url, submission_id=sid, entrypoint=f"{sys.executable} -c {shlex.quote(code)}",
                env=env, metadata={})  # fmt: skip
    try:
        progress = wait_for(lambda: RunProgress.objects.filter(run=run, step=1).first() or _dead(head, sid),
                            timeout_s=120, message="the stand-in engine's first step")  # fmt: skip
        settings.RUN_STALL_TIMEOUT_S = 3
        # Heartbeats keep arriving well after the last progress: the heartbeat reaper would never fire.
        wait_for(lambda: Run.objects.get(pk=run.pk).heartbeat_at > progress.at + timedelta(seconds=3.5),
                 timeout_s=30, message="heartbeats after the stall timeout")  # fmt: skip
        assert supervisor.reap_silent() == []
        moving = RunFactory(state="running", started_at=timezone.now() - timedelta(minutes=1),
                            heartbeat_at=timezone.now())  # fmt: skip
        progress_record(run_id=moving.pk, step=5000)  # a slow run that does move is left alone
        assert supervisor.reap_stalled() == [run.pk]
        run.refresh_from_db()
        assert run.state == "failed"
        assert "made no progress for over 3 s (last: step 1," in run.error
        assert jobs.wait_terminal(head.dashboard_url, sid, timeout=30).status == "STOPPED"
        assert Run.objects.get(pk=moving.pk).state == "running"
    finally:
        jobs.stop_all(head.dashboard_url, prefix=sid)


def _dead(head, sid: str) -> None:
    if jobs.state(head.dashboard_url, sid).terminal:
        pytest.fail(f"the stand-in engine ended:\n{jobs.logs(head.dashboard_url, sid)[-3000:]}")


def test_a_run_that_never_reports_a_step_is_stalled_from_its_start(settings):
    settings.RUN_STALL_TIMEOUT_S = 60
    started = timezone.now() - timedelta(seconds=61)
    silent = RunFactory(state="running", started_at=started, heartbeat_at=timezone.now())
    young = RunFactory(state="running", started_at=timezone.now(), heartbeat_at=timezone.now())
    assert supervisor.reap_stalled() == [silent.pk]
    assert "(none since it started)" in Run.objects.get(pk=silent.pk).error
    assert Run.objects.get(pk=young.pk).state == "running"
    settings.RUN_STALL_TIMEOUT_S = 0  # off
    assert supervisor.reap_stalled() == []


LONG_LOG = """
import time
for i in range({lines}):
    print(f"line {{i:05d}} " + "x" * 190)
    if i % 500 == 499:
        time.sleep(0.2)  # printed over a few polls, as a run prints
"""


def test_a_long_log_is_streamed_into_events_once_and_never_read_whole(launcher_stack, monkeypatch, settings):
    # What is tested here is the stream, not the lease: on a loaded 2-core CI machine one poll of this
    # log can outlast the default 15 s lease, and the stack's reaper then takes the run over (correctly).
    settings.LAUNCHER_LEASE_S = 300
    head = ray_local.ensure_started()
    sid = f"rlp-longlog-{time.time_ns()}"
    lines = 3000  # ~600 KB: read whole every second, the old tail moved ~0.6 MB per poll
    jobs.submit(head.dashboard_url, submission_id=sid, env={}, metadata={},
                entrypoint=f"{sys.executable} -c {shlex.quote(LONG_LOG.format(lines=lines))}")  # fmt: skip
    now = timezone.now()
    run = RunFactory(state="running", started_at=now, heartbeat_at=now, ray_job_id=sid,
                     cluster_address=head.dashboard_url)  # fmt: skip
    whole_reads: list[str] = []
    real_logs = jobs.logs
    monkeypatch.setattr(jobs, "logs", lambda *a: whole_reads.append(a[1]) or real_logs(*a))
    followers: list[jobs.LogFollower] = []
    real_follower = jobs.LogFollower
    monkeypatch.setattr(
        jobs, "LogFollower", lambda *a, **kw: followers.append(real_follower(*a, **kw)) or followers[-1]
    )
    try:
        assert supervisor.supervise(run_id=run.pk, owner="test-supervisor") == "succeeded"
    finally:
        jobs.stop_all(head.dashboard_url, prefix=sid)
    monkeypatch.undo()
    log = jobs.logs(head.dashboard_url, sid)
    expected = [jobs.clean_log_line(ln) for ln in log.splitlines() if ln.strip()]
    got = list(run.events.filter(kind="log").order_by("seq").values_list("message", flat=True))
    assert got == expected and sum(m.startswith("line ") for m in got) == lines  # every line, once, in order
    assert whole_reads == []  # never the whole log
    assert len(followers) == 1 and followers[0].received_chars == len(log)  # each character streamed once
    assert Supervision.objects.get(run_id=run.pk).log_offset == len(log)


def test_a_launch_that_fails_after_ray_accepted_the_job_stops_it(launcher_stack, monkeypatch):
    from django.db import transaction

    real_submit = jobs.submit

    def submit_then_lose_the_reply(address: str, **kw):
        real_submit(address, **kw)  # Ray takes the job...
        raise jobs.ClusterUnreachable(
            f"job submission to {address} failed: read timed out"
        )  # ...the reply is lost

    monkeypatch.setattr(jobs, "submit", submit_then_lose_the_reply)
    exp = ExperimentFactory(config=tiny_config(steps=2000))
    with transaction.atomic():  # held from the start: the stack's worker must not launch it too
        run = RunFactory(experiment=exp, state="starting", provider="local")
        assert services.lease_acquire(run_id=run.pk, owner="test-launcher", seconds=120)
    try:
        assert services.run_launch(run_id=run.pk, owner="test-launcher") == "failed"
        run.refresh_from_db()
        assert run.error.startswith("launch failed: job submission to") and run.ray_job_id
        assert jobs.wait_terminal(run.cluster_address, run.ray_job_id, timeout=30).status == "STOPPED"
    finally:
        services.lease_release(run_id=run.pk, owner="test-launcher")
        if run.cluster_address:
            jobs.stop_all(run.cluster_address, prefix=run.ray_job_id or "none")

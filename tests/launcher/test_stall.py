"""A deadlocked engine is found and stopped: its sink keeps heartbeating (and its supervisor, while the
Ray job exists), so the heartbeat cannot tell; no progress for RUN_STALL_TIMEOUT_S can. The engine here
is a stand-in that hangs on purpose (a real engine cannot be made to deadlock on demand): a real Ray job
on the stack's head, reporting through the real HTTP sink to the real web server, then blocking."""

from __future__ import annotations

import shlex
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.services import ingest_token_issue
from experiments.models import Run
from launcher import jobs, ray_local, supervisor
from tests.conftest import REPO_ROOT, wait_for
from tests.factories import RunFactory
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

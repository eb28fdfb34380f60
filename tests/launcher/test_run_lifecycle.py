"""End to end through the real stack, nothing mocked: the REST API on a real web server (daphne), a real
Celery worker with its beat, a real Ray head running ``python -m rl_engine train`` as Ray Jobs, the
engine's HTTP sink reporting back, and the test database."""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.request import Request, urlopen

import pytest
import yaml
from django.conf import settings

from experiments.models import Run
from experiments.run_files import run_folder
from launcher import jobs
from launcher.models import Supervision
from tests.conftest import wait_for
from tests.launcher.engine_runs import db_points, jsonl_points, tiny_config

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Api:
    """A user's token client for the real web server."""

    def __init__(self, base: str, project=None):
        from accounts.services import membership_set, token_create
        from tests.factories import ProjectFactory, UserFactory

        self.base = base
        self.user = UserFactory()
        self.project = project or ProjectFactory()
        membership_set(project=self.project, user=self.user, role="member")
        self.secret = token_create(user=self.user, name="launcher tests").secret

    def post(self, path: str, body: dict) -> dict:
        req = Request(
            f"{self.base}{path}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Token {self.secret}", "Content-Type": "application/json"},
        )
        with urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def launch(self, config: dict, priority: int = 0) -> int:
        from experiments.services import experiment_create
        from rl_engine.config import parse_config

        exp = experiment_create(
            project=self.project, user=self.user, name="launcher test", config=parse_config(config)
        )
        return self.post("/api/runs", {"experiment": exp.pk, "priority": priority})["id"]


@pytest.fixture
def api(launcher_stack) -> Api:
    return Api(launcher_stack.web.url)


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(launcher_stack, transactional_db):  # torn down before the DB flush
    """A failing test must not leave its engine running into the next one (their rows are flushed)."""
    yield
    from launcher import ray_local

    head = ray_local.read_state()
    if head is not None and ray_local.jobs_api_ok(head):
        jobs.stop_all(head.dashboard_url, timeout=15)


def state_of(run_id: int) -> str:
    return Run.objects.values_list("state", flat=True).get(pk=run_id)


def run_story(run_id: int) -> str:
    """What a run did, for a wait that timed out: its state, its events and its job's log tail."""
    run = Run.objects.get(pk=run_id)
    events = [f"{e.kind}: {e.message}" for e in run.events.order_by("seq")][-40:]
    log = ""
    if run.cluster_address and run.ray_job_id:
        try:
            log = "\n".join(job_log_lines(run)[-40:])
        except Exception as exc:
            log = f"(job log unreadable: {exc})"
    return f"state {run.state}\nevents:\n" + "\n".join(events) + f"\njob log tail:\n{log}"


def wait_state(run_id: int, state: str, timeout_s: float = 300) -> Run:
    """Wait for ``run_id`` to reach ``state``. The bound is for a hang, not a speed claim: CI runs this
    beside the production pass on 2 cores, where a cold Ray head and a job start take minutes."""
    try:
        wait_for(lambda: state_of(run_id) == state, timeout_s=timeout_s, interval_s=0.2,
                 message=f"run {run_id} to be {state}")  # fmt: skip
    except pytest.fail.Exception as exc:
        raise pytest.fail.Exception(f"{exc}\n{run_story(run_id)}") from None
    return Run.objects.get(pk=run_id)


def wait_reporting(run_id: int, min_points: int = 1, timeout_s: float = 120) -> Run:
    """Running, and the engine's metrics are arriving (it is past its start-up)."""
    wait_for(lambda: state_of(run_id) == "running" and Run.objects.get(pk=run_id).metric_points.count() >= min_points,
             timeout_s=timeout_s, interval_s=0.2, message=f"run {run_id} to run and report")  # fmt: skip
    return Run.objects.get(pk=run_id)


def job_log_lines(run: Run) -> list[str]:
    lines = jobs.logs(run.cluster_address, run.ray_job_id).splitlines()
    return [jobs.clean_log_line(ln) for ln in lines if ln.strip()]


def alive_actors(run: Run) -> int:
    """Actors of the run's Ray job still alive on the cluster (the resources a stop must free)."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors

    ray_job_id = JobSubmissionClient(run.cluster_address).get_job_info(run.ray_job_id).job_id
    filters = [("job_id", "=", ray_job_id), ("state", "=", "ALIVE")]
    return len(list_actors(address=run.cluster_address, filters=filters))


def tailed_lines(run: Run) -> list[str]:
    return list(run.events.filter(kind="log", data={}).order_by("seq").values_list("message", flat=True))


@pytest.mark.smoke  # the demo path on either deployment: the embedded pass runs it too
def test_launch_through_the_api_runs_to_success_with_metrics_and_logs(api):
    run_id = api.launch(tiny_config(steps=3))
    run = wait_state(run_id, "succeeded")
    assert run.ray_job_id and run.cluster_address.startswith("http://127.0.0.1:")
    assert jobs.state(run.cluster_address, run.ray_job_id).status == "SUCCEEDED"
    expected = jsonl_points(run)
    assert {k for k, _, _ in expected} >= {"reward/mean", "actor/pg_loss"}
    got = db_points(run)
    assert sorted(got) == sorted(expected), (
        set(got) ^ expected,
        job_log_lines(run)[-30:],
    )  # every point, once
    assert tailed_lines(run) == job_log_lines(run)  # the whole job log, in order, once
    states = [e.data["to"] for e in run.events.filter(kind="status").order_by("seq") if "to" in e.data]
    assert states == ["queued", "starting", "running", "succeeded"]
    # The ingest token reached the engine through a file: the job's environment (shown by the Ray
    # dashboard) holds only its path.
    from ray.job_submission import JobSubmissionClient

    env = JobSubmissionClient(run.cluster_address).get_job_info(run.ray_job_id).runtime_env["env_vars"]
    assert "RL_ENGINE_INGEST_TOKEN" not in env and not any(v.startswith("rlp_") for v in env.values())
    assert env["RL_ENGINE_INGEST_TOKEN_FILE"].endswith("/ingest-token")


def test_engine_failure_marks_the_run_failed_with_the_engines_error(api):
    cfg = tiny_config(steps=3)
    missing = Path(settings.MODEL_ROOTS[0]) / f"no-such-model-{time.time_ns()}"
    cfg["model"] = {"path": str(missing)}  # no `tiny`: nothing builds it
    run = wait_state(api.launch(cfg), "failed")
    assert "no-such-model" in run.error and "config.json" in run.error
    assert jobs.state(run.cluster_address, run.ray_job_id).status == "FAILED"


@pytest.mark.smoke  # the demo path on either deployment: the embedded pass runs it too
def test_cancel_mid_run_is_cancelled_within_10s_then_resume_continues_from_the_checkpoint(api):
    run = wait_reporting(api.launch(tiny_config(steps=2000)), min_points=20)
    assert alive_actors(run) >= 2  # rollouter and trainer (at least) hold the cluster
    api.post(f"/api/runs/{run.pk}/cancel", {})
    wait_state(run.pk, "cancelled", timeout_s=10)
    run.refresh_from_db()
    assert jobs.state(run.cluster_address, run.ray_job_id).status == "STOPPED"
    wait_for(lambda: alive_actors(run) == 0, timeout_s=10, message="the job's actors to be gone")
    assert run.checkpoints.exists(), "the graceful stop should have checkpointed"
    ckpt = run.checkpoints.order_by("-step").first()

    # the run says what the cancel kept (its page shows the same), and what a stop of it needs
    def notes() -> list[str]:
        return [e.message for e in run.events.filter(kind="log") if e.message.startswith("cancelled: ")]

    wait_for(lambda: notes(), timeout_s=10, message="the cancel's note")
    assert notes() == [f"cancelled: checkpoint at step {ckpt.step} kept"]
    assert run.stop_grace_s and run.stop_grace_s > 0

    resumed_id = api.post(f"/api/runs/{run.pk}/resume", {})["id"]
    resumed = wait_reporting(resumed_id)
    assert resumed.resumed_from_id == run.pk
    assert resumed.resumed_from_checkpoint_id == ckpt.pk  # the launcher put its path in the placement
    spec = yaml.safe_load((run_folder(resumed) / "job.yaml").read_text())
    assert spec["placement"]["resume_from"] == ckpt.path and spec["config"] == resumed.config
    first_step = min(resumed.metric_points.values_list("step", flat=True))
    assert ckpt.step <= first_step <= ckpt.step + 1  # continues after the checkpoint, not from 0
    api.post(f"/api/runs/{resumed_id}/cancel", {})
    wait_state(resumed_id, "cancelled", timeout_s=10)


def test_killed_worker_is_replaced_and_the_run_reattached_not_restarted(api, launcher_stack):
    run = wait_reporting(api.launch(tiny_config(steps=2000)), min_points=5)
    before = Supervision.objects.get(run_id=run.pk)
    assert before.owner
    launcher_stack.worker.kill()  # kill -9 of the worker's process group (its beat included)
    launcher_stack.worker = launcher_stack.restart_worker()

    def reattached() -> bool:
        sup = Supervision.objects.get(run_id=run.pk)
        return sup.owner not in ("", before.owner) and sup.attaches > before.attaches

    wait_for(reattached, timeout_s=30, interval_s=0.2, message="a new supervisor to re-attach")
    assert state_of(run.pk) == "running"
    assert jobs.state(run.cluster_address, run.ray_job_id).status == "RUNNING"
    count = run.metric_points.count()
    wait_for(lambda: run.metric_points.count() > count, timeout_s=30, message="metrics to keep arriving")
    api.post(f"/api/runs/{run.pk}/cancel", {})
    wait_state(run.pk, "cancelled", timeout_s=15)
    submits = run.events.filter(kind="log", message__startswith="submitted Ray job").count()
    assert submits == 1  # one job: re-attached, never started twice
    tailed = tailed_lines(run)
    assert tailed == job_log_lines(run)[: len(tailed)]  # the log tail resumed where the dead one stopped


def test_web_server_restart_mid_run_loses_and_duplicates_no_metric_point(api, launcher_stack):
    run = wait_reporting(api.launch(tiny_config(steps=40)), min_points=10)
    launcher_stack.web.stop()
    time.sleep(4)  # the engine keeps training; its sink spools what it cannot deliver
    launcher_stack.web.start()
    run = wait_state(run.pk, "succeeded")
    points = db_points(run)
    assert sorted(points) == sorted(jsonl_points(run))
    assert max(step for _, step, _ in points) >= 39


@pytest.mark.extended  # ~1.5 min; the admission rules run in CI in tests/launcher/test_admission_and_reaper.py
def test_two_runs_with_a_limit_of_one_the_second_waits_then_runs(api):
    # The stack runs with RUN_CONCURRENCY_LIMIT_PER_PROJECT=1; both runs are in one project.
    first = api.launch(tiny_config(steps=8))
    second = api.launch(tiny_config(steps=2))
    wait_reporting(first)
    assert state_of(second) == "queued"
    wait_state(second, "succeeded", timeout_s=180)
    a, b = Run.objects.get(pk=first), Run.objects.get(pk=second)
    assert a.state == "succeeded"
    assert b.started_at >= a.finished_at


def test_a_running_run_whose_job_vanished_is_failed_with_the_reason(launcher_stack):
    from django.utils import timezone

    from launcher import ray_local
    from tests.factories import RunFactory

    head = ray_local.ensure_started()  # the stack's own head (RAY_LOCAL_DIR of this session)
    now = timezone.now()
    run = RunFactory(
        state="running",
        started_at=now,
        heartbeat_at=now,
        ray_job_id="rlp-never-submitted",
        cluster_address=head.dashboard_url,
    )  # e.g. the cluster was replaced under the run
    run = wait_state(run.pk, "failed", timeout_s=30)  # the sweep hands it to a supervisor, which looks
    assert "rlp-never-submitted no longer exists" in run.error


def test_a_run_on_a_stopped_local_head_is_failed_at_once_with_the_reason(launcher_stack):
    """The platform was stopped (its local head with it) while a run was active; after the restart the
    run's cluster address is dead for good: fail it now, not after the heartbeat timeout."""
    import socket

    from django.utils import timezone

    from tests.factories import RunFactory

    with socket.socket() as s:  # a port nothing listens on: the old head's dashboard
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    now = timezone.now()
    run = RunFactory(
        state="running",
        started_at=now,
        heartbeat_at=now,
        provider="local",
        ray_job_id="rlp-on-the-old-head",
        cluster_address=dead,
    )
    run = wait_state(run.pk, "failed", timeout_s=30)  # well inside the stack's heartbeat timeout
    assert f"local Ray head at {dead} was stopped" in run.error


def test_provider_address_runs_on_an_existing_cluster_given_by_its_dashboard_url(launcher_stack):
    from experiments.services import experiment_create, run_create
    from rl_engine.config import parse_config
    from tests.factories import ProjectFactory

    exp = experiment_create(
        project=ProjectFactory(), user=None, name="address", config=parse_config(tiny_config(steps=2))
    )
    run = wait_state(run_create(experiment=exp, user=None, provider="address").pk, "succeeded")
    assert run.provider == "address"
    assert run.cluster_address == launcher_stack.env["RAY_ADDRESS"]  # the worker's RAY_ADDRESS
    assert sorted(db_points(run)) == sorted(jsonl_points(run))


# --- fork (issue 22) -----------------------------------------------------------------------------------


def test_fork_from_a_middle_checkpoint_continues_its_steps_with_the_changed_learning_rate(api):
    parent = wait_state(api.launch(tiny_config(steps=4, checkpoint_every=2, keep_checkpoints=3)), "succeeded")
    at_2 = parent.checkpoints.get(step=2)
    assert parent.config["trainer"]["lr"] != 5e-7
    body = {"checkpoint": at_2.pk, "config_overrides": {"trainer": {"lr": 5e-7}}}
    fork = wait_state(api.post(f"/api/runs/{parent.pk}/fork", body)["id"], "succeeded")
    assert fork.resumed_from_id == parent.pk and fork.resumed_from_checkpoint_id == at_2.pk
    assert fork.config["trainer"]["lr"] == 5e-7
    assert {**fork.config, "trainer": {**fork.config["trainer"], "lr": parent.config["trainer"]["lr"]}} == (
        parent.config
    )
    spec = yaml.safe_load((run_folder(fork) / "job.yaml").read_text())
    assert spec["placement"]["resume_from"] == at_2.path and spec["config"] == fork.config
    steps = sorted(set(fork.metric_points.values_list("step", flat=True)))
    assert steps[0] == at_2.step + 1 and steps[-1] == 4, steps
    # the engine trained at the fork's learning rate, not the checkpoint's (constant schedule)
    lrs = dict(fork.metric_points.filter(key="actor/lr").values_list("step", "value"))
    assert lrs and all(v == pytest.approx(5e-7, rel=1e-9) for v in lrs.values()), lrs
    parent_lrs = dict(parent.metric_points.filter(key="actor/lr").values_list("step", "value"))
    assert parent_lrs[2] == pytest.approx(parent.config["trainer"]["lr"], rel=1e-9)

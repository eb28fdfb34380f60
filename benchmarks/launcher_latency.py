"""Launcher latencies on the real stack: launch (API call → running → first metric), cancel (API call →
cancelled), re-attach after ``kill -9`` of the Celery worker, and reap (heartbeat deadline → failed).

    .venv/bin/python benchmarks/launcher_latency.py              # embedded default (SQLite, file broker)
    .venv/bin/python benchmarks/launcher_latency.py --repeats 5 --sweep-interval 3
    .venv/bin/python benchmarks/launcher_latency.py --smoke     # the cold launch only, a 1 s sweep: a check

Everything runs in a scratch VAR_DIR (its own SQLite database, broker folders and local Ray head, all
removed at the end): the web tier as production runs it (gunicorn with one uvicorn worker: the
embedded default has no Redis), one ``celery worker -B`` (threads pool) and the platform's
local Ray head; runs are tiny ``demo-cpu`` configs (16 samples a step) launched through the REST API
with a user token. The first launch also starts the Ray head ("cold"); the others reuse it ("warm").
Reap: a ``running`` run whose cluster is unreachable (so nobody heartbeats it) must turn ``failed`` once
its heartbeat is older than RUN_HEARTBEAT_TIMEOUT_S; reported as the delay past that deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
HEARTBEAT_TIMEOUT_S = 5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> float:
    """Seconds (monotonic clock) at which ``pred`` first held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic()
        time.sleep(interval)
    logs = sorted(Path(os.environ.get("VAR_DIR", "/nonexistent")).glob("*.log"))
    tails = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)
    raise SystemExit(f"error: timed out after {timeout:.0f} s waiting for {what}{tails}")


class Stack:
    """Web server + Celery worker (with beat) on a scratch VAR_DIR."""

    def __init__(self, var_dir: Path, sweep_interval: int, heartbeat_timeout_s: int = HEARTBEAT_TIMEOUT_S):
        self.var_dir, self.heartbeat_timeout_s = var_dir, heartbeat_timeout_s
        self.port = free_port()
        self.env = {**os.environ, "VAR_DIR": str(var_dir), "PLATFORM_URL": f"http://127.0.0.1:{self.port}",
                    "PYTHONPATH": f"{ROOT / 'platform'}:{ROOT}", "RAY_USAGE_STATS_ENABLED": "0",
                    "RUN_HEARTBEAT_TIMEOUT_S": str(heartbeat_timeout_s), "RUN_CONCURRENCY_LIMIT": "4",
                    "LAUNCHER_SWEEP_INTERVAL_S": str(sweep_interval), "RAY_LOCAL_NUM_CPUS": "4"}  # fmt: skip
        for name in ("DATABASE_URL", "REDIS_URL", "CELERY_QUEUE", "CELERY_LAUNCHER_QUEUE", "RAY_LOCAL_DIR"):
            self.env.pop(name, None)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def attach(self) -> None:
        """Point this process's Django at the stack's platform (its VAR_DIR's database, no Redis, no
        queues of another deployment), migrate that database and set Django up."""
        os.environ.update({k: self.env[k] for k in ("VAR_DIR", "PLATFORM_URL", "RUN_HEARTBEAT_TIMEOUT_S")})
        for name in ("DATABASE_URL", "REDIS_URL", "CELERY_QUEUE", "CELERY_LAUNCHER_QUEUE", "RAY_LOCAL_DIR"):
            os.environ.pop(name, None)
        os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=self.env, check=True)
        import django

        django.setup()

    def _start(self, name: str, cmd: list[str]) -> None:
        log = open(self.var_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        self.procs[name] = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip

    def start_web(self) -> None:
        # production's web tier (platform/config/gunicorn.py); one uvicorn worker on the embedded default
        self._start("web", [sys.executable, "-m", "gunicorn", "-c", "python:config.gunicorn", "-b",
                            f"127.0.0.1:{self.port}", "config.asgi:application"])  # fmt: skip
        wait(lambda: _answers(f"http://127.0.0.1:{self.port}/api/schema/"), 60, "the web server")

    def start_worker(self) -> None:
        self._start("worker", [sys.executable, "-m", "celery", "-A", "config", "worker", "-B", "-l", "INFO",
                               "--pool=threads", "--concurrency=8", "--without-gossip", "--without-mingle",
                               "--without-heartbeat", "-s", str(self.var_dir / f"beat-{time.time_ns()}")])  # fmt: skip
        log = self.var_dir / "worker.log"
        seen = log.read_text(errors="replace").count(" ready.") if log.exists() else 0
        wait(lambda: log.read_text(errors="replace").count(" ready.") > seen, 60, "the worker", 0.1)

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)


def _answers(url: str) -> bool:
    try:
        with urlopen(url, timeout=2):
            return True
    except OSError as exc:
        return bool(getattr(exc, "code", None))


def api_post(stack: Stack, token: str, path: str, body: dict) -> dict:
    req = Request(
        f"http://127.0.0.1:{stack.port}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def tiny_config(steps: int) -> Any:
    """The served demo preset made small, as the typed config the services take."""
    from experiments.config_policy import preset_document
    from rl_engine.config import parse_config

    cfg = preset_document("demo-cpu")  # its tiny model under a model root of the scratch VAR_DIR
    cfg["rollout"]["n"] = 4
    cfg["trainer"].update(total_steps=steps, batch_size=16, mini_batch_size=16)
    cfg["logging"] = {"sinks": ["stdout"]}
    return parse_config(cfg)


def measure_launch(stack: Stack, token: str, experiment_id: int) -> tuple[int, float, float]:
    from experiments.models import Run
    from tracking.models import MetricPoint

    t0 = time.monotonic()
    run_id = api_post(stack, token, "/api/runs", {"experiment": experiment_id})["id"]
    t_run = wait(lambda: Run.objects.filter(pk=run_id, state="running").exists(), 180, "running")
    t_metric = wait(lambda: MetricPoint.objects.filter(run_id=run_id).exists(), 180, "a first metric")
    return run_id, t_run - t0, t_metric - t0


def measure_cancel(stack: Stack, token: str, run_id: int) -> float:
    from experiments.models import Run

    t0 = time.monotonic()
    api_post(stack, token, f"/api/runs/{run_id}/cancel", {})
    return wait(lambda: Run.objects.filter(pk=run_id, state="cancelled").exists(), 60, "cancelled") - t0


def measure_reattach(stack: Stack, run_id: int) -> float:
    from launcher.models import Supervision

    before = Supervision.objects.get(run_id=run_id).owner
    t0 = time.monotonic()
    stack.kill("worker")
    stack.start_worker()
    owner = lambda: Supervision.objects.filter(run_id=run_id).values_list("owner", flat=True).first()  # noqa: E731
    return wait(lambda: owner() not in ("", before), 120, "a new supervisor") - t0


def measure_reap(project: Any, user: Any, heartbeat_timeout_s: int) -> float:
    from django.utils import timezone

    from experiments.models import Provider, Run
    from experiments.services import experiment_create

    exp = experiment_create(project=project, user=user, name="reap", config=tiny_config(1))
    now = timezone.now()
    run = Run.objects.create(
        experiment=exp,
        project=project,
        number=1,
        config=exp.config,
        state="running",
        started_at=now,
        heartbeat_at=now,
        ray_job_id="rlp-bench-lost",
        # An existing cluster where nothing listens: unreachable, so only the reaper can end the run (a
        # local head's run whose head is gone is failed by its supervisor at once, not reaped).
        provider=Provider.ADDRESS,
        cluster_address=f"http://127.0.0.1:{free_port()}",
    )
    deadline = time.monotonic() + heartbeat_timeout_s - (timezone.now() - now).total_seconds()
    t_failed = wait(lambda: Run.objects.filter(pk=run.pk, state="failed").exists(), 120, "the reaper")
    return t_failed - deadline


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="warm launches (each then cancelled)")
    p.add_argument("--sweep-interval", type=int, default=3, help="LAUNCHER_SWEEP_INTERVAL_S")
    p.add_argument(
        "--heartbeat-timeout", type=int, default=HEARTBEAT_TIMEOUT_S, help="RUN_HEARTBEAT_TIMEOUT_S"
    )
    p.add_argument("--smoke", action="store_true", help="no warm launch, a 1 s sweep interval")
    args = p.parse_args()
    if args.smoke:  # the code paths of the full run at tiny sizes (run_all.py --smoke): figures mean nothing
        # A run's ingest token lives one heartbeat timeout unless renewed: 5 s is too short a margin on a
        # loaded machine (CI), where the supervisor's first renewal can come later.
        args.repeats, args.sweep_interval, args.heartbeat_timeout = 0, 1, 15
    var_dir = Path(tempfile.mkdtemp(prefix="rlp-bench-", dir="/tmp"))
    stack = Stack(var_dir, args.sweep_interval, args.heartbeat_timeout)
    stack.attach()
    from django.contrib.auth import get_user_model

    from accounts.services import membership_set, project_create, token_create
    from experiments.services import experiment_create
    from launcher import ray_local

    user = get_user_model().objects.create_user("bench", password="bench-password")
    project = project_create(name="bench", user=user)
    membership_set(project=project, user=user, role="owner")
    token = token_create(user=user, name="bench").secret
    exp = experiment_create(project=project, user=user, name="latency", config=tiny_config(100000))
    results: dict[str, Any] = {}
    try:
        stack.start_web()
        stack.start_worker()
        launches, cancels = [], []
        for _ in range(args.repeats + 1):  # one at a time: each launch is cancelled before the next
            launches.append(measure_launch(stack, token, exp.pk))
            cancels.append(measure_cancel(stack, token, launches[-1][0]))
        results["launch_cold_running_s"], results["launch_cold_first_metric_s"] = launches[0][1:]
        warm = launches[1:]  # none with --repeats 0
        results["launch_warm_running_s"] = statistics.median(x[1] for x in warm) if warm else None
        results["launch_warm_first_metric_s"] = statistics.median(x[2] for x in warm) if warm else None
        results["cancel_s"] = [round(c, 2) for c in cancels]
        results["cancel_median_s"] = statistics.median(cancels)
        run_id = measure_launch(stack, token, exp.pk)[0]
        results["reattach_after_kill9_s"] = measure_reattach(stack, run_id)
        measure_cancel(stack, token, run_id)
        results["reap_past_deadline_s"] = measure_reap(project, user, args.heartbeat_timeout)
        results["heartbeat_timeout_s"] = args.heartbeat_timeout
        results["sweep_interval_s"] = args.sweep_interval
    finally:
        stack.stop()
        ray_local.stop()
        shutil.rmtree(var_dir, ignore_errors=True)
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in results.items()}, indent=2))
    if results["reap_past_deadline_s"] < 0:  # something else ended the run: the reaper was not measured
        raise SystemExit("error: the lost run failed before its heartbeat deadline, not by the reaper")


if __name__ == "__main__":
    main()

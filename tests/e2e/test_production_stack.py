"""The production stack end to end, as deployed: PostgreSQL, Redis, the web tier (gunicorn managing two
uvicorn worker processes on one port), a Celery worker and a separate Celery beat as processes of their own, with DEBUG off, a secret key, the allowed hosts of
docker/env.example and a TLS proxy's X-Forwarded-Proto; runs launched through the REST API and followed
over the run websocket (a real login, a real websocket client), the engine on the platform's Ray head.

Runs in the PostgreSQL + Redis pass (DATABASE_URL and REDIS_URL set). Redis here is a private
``redis-server`` on a port of its own, because one test restarts it (the shared one is never touched).
"""

from __future__ import annotations

import itertools
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from experiments.models import Run
from harness.private_redis import PrivateRedis, require_redis_server
from scripts.platform_stack import Api, Follower, PlatformStack
from tests.conftest import SESSION_QUEUE, child_process_env, wait_for
from tests.launcher.engine_runs import db_points, jsonl_records, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PUBLIC_HOST = "rl.example.com"  # docker/env.example's DJANGO_ALLOWED_HOSTS
PASSWORD = "pw-for-tests"  # tests.factories.UserFactory


@dataclass
class Production:
    stack: PlatformStack
    redis: PrivateRedis
    tmp: Path


@pytest.fixture(scope="module")
def production(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Production]:
    if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        pytest.skip("the production stack test runs in the PostgreSQL + Redis pass (DATABASE_URL, REDIS_URL)")
    require_redis_server()
    from django.conf import settings

    from launcher import ray_local

    tmp = tmp_path_factory.mktemp("production")
    redis = PrivateRedis(tmp)
    redis.start()
    queue = f"{SESSION_QUEUE}-production"
    with django_db_blocker.unblock():
        env = child_process_env()
    env.pop("LIVE_POLL_INTERVAL_S", None)  # the deployment's default: no poll while Redis works
    env |= {
        "REDIS_URL": redis.url,
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": f"{PUBLIC_HOST},localhost",
        "DJANGO_CSRF_TRUSTED_ORIGINS": f"https://{PUBLIC_HOST}",
        "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
        "CELERY_QUEUE": queue,
        "CELERY_LAUNCHER_QUEUE": queue,
        "RAY_LOCAL_DIR": str(tmp / "ray"),
        "RAY_LOCAL_NUM_CPUS": "4",
        "RUN_CONCURRENCY_LIMIT": "4",
        "RUN_CANCEL_GRACE_S": "4",
        "LAUNCHER_SWEEP_INTERVAL_S": "1",
    }
    stack = PlatformStack(tmp, env)
    env["PLATFORM_URL"] = stack.url  # the engine's internal URL (allowed, never redirected)
    try:
        stack.start_web(workers=2)  # several web processes, as production runs (WEB_CONCURRENCY)
        stack.start_worker(queue)
        stack.start_beat()
        yield Production(stack=stack, redis=redis, tmp=tmp)
    finally:
        stack.stop()
        previous = settings.RAY_LOCAL_DIR
        settings.RAY_LOCAL_DIR = env["RAY_LOCAL_DIR"]
        try:
            ray_local.stop()  # the head the worker started for these runs, and its jobs
        finally:
            settings.RAY_LOCAL_DIR = previous
        redis.stop()


def client(production: Production) -> tuple[Api, str, int]:
    """A member's token client on the public name behind the proxy, their session cookie, a project."""
    from accounts.services import project_create, token_create
    from tests.factories import UserFactory

    user = UserFactory()
    project = project_create(name=f"prod-{user.pk}", user=user)
    api = Api(
        production.stack.url, token_create(user=user, name="e2e").secret, host=PUBLIC_HOST, https_proxy=True
    )
    return api, api.login(user.username, PASSWORD), project.pk


def follow(production: Production, run_id: int, cookie: str) -> Follower:
    return Follower(production.stack.url, run_id, cookie, host=PUBLIC_HOST, origin=f"https://{PUBLIC_HOST}")


def launch(api: Api, project: int, config: dict) -> int:
    exp = api.post("/api/experiments", {"project": project, "name": "production e2e", "config": config})
    return api.post("/api/runs", {"experiment": exp["id"]})["id"]


def steps_seen(f: Follower) -> int:
    return len({step for _, step, _ in f.points()})


def largest_gap_s(f: Follower) -> float:
    times = [t for t, _ in f.snapshot()]
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def test_a_run_is_followed_over_the_websocket_through_cancel_resume_and_a_silent_spell(production):
    api, cookie, project = client(production)
    config = tiny_config(steps=200)  # a tiny step takes ~0.05-0.2 s: the cancel lands early
    first = launch(api, project, config)
    ws_first = follow(production, first, cookie)
    ws_first.wait_for(lambda f: steps_seen(f) >= 1, 180, "the first run's metrics over the websocket")
    api.post(f"/api/runs/{first}/cancel", {})
    ws_first.wait_for(lambda f: "cancelled" in f.states(), 30, "the first run to be cancelled")
    assert ws_first.states()[-3:] == ["running", "cancelling", "cancelled"]

    # The resumed run waits queued while the worker is paused: its socket gets nothing for over 10 s
    # (on Redis, channels-redis' 5 s blocking reads used to kill such a socket), then follows it live.
    production.stack.pause("worker")
    try:
        resumed = api.post(f"/api/runs/{first}/resume", {})["id"]
        ws = follow(production, resumed, cookie)
        ws.wait_for(lambda f: f.of_kind("hello"), 10, "hello")
        time.sleep(11)
        assert [m["kind"] for _, m in ws.snapshot()] == ["hello", "event"]  # hello, the "queued" event
    finally:
        production.stack.resume("worker")
    ws.wait_for(lambda f: "succeeded" in f.states(), 240, "the resumed run to succeed")
    assert ws.states() == ["queued", "starting", "running", "succeeded"]
    assert largest_gap_s(ws) > 10

    runs = {r.pk: r for r in Run.objects.filter(pk__in=(first, resumed))}
    ckpt = runs[first].checkpoints.order_by("-step").first()
    assert runs[resumed].resumed_from_checkpoint_id == ckpt.pk
    assert ckpt.step < 199, "the first run was cancelled too late to leave the resumed run anything to do"
    assert min(s for _, s, _ in db_points(runs[resumed])) in (ckpt.step, ckpt.step + 1)  # not from 0
    # Every point the engine wrote to its JSONL logs (one file per run, in the run's folder) is stored.
    for run in runs.values():
        assert sorted(jsonl_records(run)) == sorted(db_points(run))
    # And every stored point of the followed run reached the browser, with its stored value. (A point
    # read by the 10 s safety poll while its live message is still on the way comes twice: charts are
    # keyed by step, so the protocol allows that.)
    assert set(ws.points()) == set(db_points(runs[resumed]))
    ws.close()
    ws_first.close()


def test_a_redis_restart_under_the_live_stack_loses_nothing_and_new_runs_start(production):
    api, cookie, project = client(production)
    config = tiny_config(steps=250)
    training = launch(api, project, config)
    ws = follow(production, training, cookie)
    ws.wait_for(lambda f: steps_seen(f) >= 3, 180, "the training run's metrics")

    production.redis.stop()  # an outage: every connection reset, nothing kept
    time.sleep(3)
    production.redis.start()
    time.sleep(5)
    later = launch(api, project, tiny_config(steps=20))
    ws_later = follow(production, later, cookie)
    # What this catches is a worker or a web process that never recovers from the outage (the task not
    # taken, the socket never fed). The bound allows a Ray job's start and its first step on a loaded
    # 2-core machine beside the training run (on a quiet stack it starts in about a second).
    ws_later.wait_for(lambda f: steps_seen(f) >= 1, 90, "the run launched after the restart to stream")

    for run_id, f in ((training, ws), (later, ws_later)):
        f.wait_for(lambda f: f.states()[-1:] == ["succeeded"], 240, f"run {run_id} to succeed")
    for name in ("web", "worker", "beat"):
        assert production.stack.alive(name), f"{name} exited:\n{production.stack.log(name)[-3000:]}"
    assert "Unrecoverable error" not in production.stack.log("worker")
    run = Run.objects.get(pk=training)
    stored = db_points(run)
    assert sorted(stored) == sorted(jsonl_records(run))  # no point lost
    # The socket followed the database while Redis was away and the bus again after. A batch whose
    # publish failed just as Redis came back is sent by the next safety poll (LIVE_POLL_INTERVAL_S, 10 s
    # with Redis): every point arrives, with its stored value (around the switch some may come twice).
    ws.wait_for(lambda f: set(f.points()) >= set(stored), 25, "every stored point over the websocket")
    assert set(ws.points()) == set(stored)
    wait_for(lambda: Run.objects.get(pk=later).state == "succeeded", timeout_s=30, message="the later run")
    ws.close()
    ws_later.close()


def test_a_websocket_on_either_web_process_sees_points_posted_to_the_other(production):
    """Two web processes share the port; the kernel hands each connection to one of them. Followers are
    opened until both processes hold some, then points are posted (each POST on a connection of its own,
    so on either process): every follower receives every point, whichever process stored it."""
    from experiments.models import RunState
    from tests.factories import ExperimentFactory, RunFactory

    api, cookie, project = client(production)
    # A finished run: the launcher leaves it alone, and members may still post to it.
    run = RunFactory(experiment=ExperimentFactory(project_id=project), state=RunState.SUCCEEDED)
    followers: list[Follower] = []
    served: dict[int, set[int]] = {}
    for _ in range(24):
        followers.append(follow(production, run.pk, cookie))
        followers[-1].wait_for(lambda f: f.of_kind("hello"), 10, "hello")
        by_process = production.stack.web_client_ports()
        served = {pid: {f.local_port for f in followers} & ports for pid, ports in by_process.items()}
        if len(served) == 2 and all(served.values()):
            break
    assert len(served) == 2 and all(served.values()), f"followers did not land on both processes: {served}"
    sent = set()
    for step in range(10):
        body = {"points": [{"key": "cross/x", "step": step, "value": step / 2, "wall_time": time.time()}]}
        assert api.post(f"/api/runs/{run.pk}/metrics", body)["inserted"] == 1
        sent.add(("cross/x", step, step / 2))
    for f in followers:
        # Through the bus, not the database poll: the points carried by live messages alone hold every
        # posted point. (A safety poll that happens to run between a point's commit and its live message
        # may send it first; the live message still comes, and that is what this test is about.)
        try:
            f.wait_for(lambda f: live_points(f) >= sent, 20, "every posted point at every follower, live")
        except TimeoutError as exc:
            raise AssertionError(delivery_report(production, followers, served, sent)) from exc
        assert len(live_points(f)) == len(sent)  # each once, with its stored value
    for f in followers:
        f.close()


def delivery_report(
    production: Production, followers: list[Follower], served: dict[int, set[int]], sent: set
) -> str:
    """What each follower received, by web process and source, and what the web processes logged about
    the bus: enough to tell a lost publish from a consumer that stopped reading."""
    process = {port: pid for pid, ports in served.items() for port in ports}
    lines = [f"posted: {sorted(s for _, s, _ in sent)}"]
    for f in followers:
        polled = {s for m in f.of_kind("metrics") if m.get("source") == "poll" for s in m["series"].get("cross/x", {}).get("steps", [])}  # fmt: skip
        lines.append(
            f"follower :{f.local_port} on web pid {process.get(f.local_port)}: live steps "
            f"{sorted(s for _, s, _ in live_points(f))}, polled steps {sorted(polled)}, closed: {f.closed}"
        )
    logged = [
        ln
        for ln in production.stack.log("web").splitlines()
        if any(w in ln for w in ("live bus", "publish", "Error"))
    ]
    lines.append("web log lines about the live bus or publishing (last 30):")
    lines.extend(logged[-30:])
    return "\n".join(lines)


def live_points(f: Follower) -> set[tuple[str, int, float]]:
    """The (key, step, value) carried by messages the live bus delivered (not the safety poll)."""
    return {
        (key, step, value)
        for m in f.of_kind("metrics")
        if m.get("source", "live") == "live"
        for key, s in m["series"].items()
        for step, value in zip(s["steps"], s["values"], strict=True)
    }

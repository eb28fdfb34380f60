"""Live-update latency on the real stack: engine → database → browser, and POST → websocket.

    .venv/bin/python benchmarks/live_latency.py                         # both deployments, flush 0.05 s vs 0.5 s
    .venv/bin/python benchmarks/live_latency.py --deployments redis --flush 0.05 --steps 400
    .venv/bin/python benchmarks/live_latency.py --smoke    # redis, one flush, 12 steps: a check that it runs

For each deployment and each sink flush interval a fresh stack runs in a scratch VAR_DIR (removed at the
end): daphne, a Celery worker with its beat, the platform's local Ray head. ``redis`` is the production
stack (a scratch PostgreSQL database, a private redis-server, DEBUG off behind a TLS proxy's header);
``embedded`` is the default (SQLite, file broker, in-process channel layer). A logged-in websocket client
follows a tiny ``demo-cpu`` run (16 samples a step) launched through the REST API while it trains, and a
second run to which the client posts a 30-point batch every 100 ms through the API.

- engine → browser: websocket receipt time minus the point's ``wall_time`` (the engine's clock when it
  logged the step; same machine), one figure per step (a step's points travel together).
- POST → websocket: receipt time minus the time the POST was sent, one figure per batch.

The flush interval is the engine sink's wait after the first queued point (``RL_ENGINE_FLUSH_S``): 0.05 s
is the default, 0.5 s what it was before (the baseline). Medians, p95 and max; the first 10 steps (the
engine's start-up) are left out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from scripts.platform_stack import Api, PlatformStack  # noqa: E402

PASSWORD = "bench-password-" + secrets.token_hex(4)
PUBLIC_HOST = "rl.example.com"
SETUP = """
import json, django
from datetime import UTC, datetime, timedelta
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth import get_user_model
from accounts.services import ingest_token_issue, project_create, token_create
from experiments.models import Run
from experiments.services import experiment_create
from experiments.config_policy import platform_preset
user = get_user_model().objects.create_user("bench", password=%r)
project = project_create(name="bench", user=user)
exp = experiment_create(project=project, user=user, name="probe", config=platform_preset("demo-cpu"))
far = datetime.now(UTC) + timedelta(hours=6)  # benchmarks without heartbeats outlive the token's renewal window
runs = [Run.objects.create(experiment=exp, project=project, number=i + 1, config=exp.config, state="running")
        for i in range(%d)]
print(json.dumps({"token": token_create(user=user, name="bench").secret, "project": project.pk,
                  "runs": [r.pk for r in runs], "ingest": [ingest_token_issue(run=r, expires_at=far).secret for r in runs]}))
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "p50_ms": round(statistics.median(ms)), "p95_ms": round(pct(ms, 0.95)),
            "max_ms": round(max(ms))}  # fmt: skip


def scratch_postgres(name: str) -> str:
    import psycopg

    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgres://postgres@127.0.0.1:5432/{name}"


def drop_postgres(name: str) -> None:
    import psycopg

    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Deployment:
    """A stack in a scratch VAR_DIR; ``redis``: PostgreSQL + a private redis-server, DEBUG off. ``root``:
    the source tree it runs (default: this one; benchmarks/live_load.py runs an older commit's as well)."""

    def __init__(self, kind: str, flush_s: float, probe_runs: int = 1, root: Path = ROOT) -> None:
        from harness.private_redis import PrivateRedis

        self.kind, self.root = kind, root
        self.var_dir = Path(tempfile.mkdtemp(prefix="rlp-live-", dir="/tmp"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_", "REDIS_",
                                                                       "CELERY_", "RAY_LOCAL", "LIVE_"))}  # fmt: skip
        env |= {"VAR_DIR": str(self.var_dir), "RAY_USAGE_STATS_ENABLED": "0", "RUN_CONCURRENCY_LIMIT": "32",
                "RAY_LOCAL_NUM_CPUS": "4", "RL_ENGINE_FLUSH_S": str(flush_s), "CELERY_QUEUE": f"bench-{os.getpid()}",
                "DJANGO_SETTINGS_MODULE": "config.settings"}  # fmt: skip
        self.redis = None
        self.db_name = f"rlp_bench_live_{os.getpid()}"
        if kind == "redis":
            self.redis = PrivateRedis(self.var_dir)
            self.redis.start()
            env |= {"DATABASE_URL": scratch_postgres(self.db_name), "REDIS_URL": self.redis.url, "DJANGO_DEBUG": "0",
                    "DJANGO_SECRET_KEY": secrets.token_urlsafe(50), "DJANGO_ALLOWED_HOSTS": PUBLIC_HOST,
                    "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto"}  # fmt: skip
        self.stack = PlatformStack(self.var_dir, env, root=root)
        env["PLATFORM_URL"] = self.stack.url
        out = subprocess.run([sys.executable, "-c", SETUP % (PASSWORD, probe_runs)], cwd=root, check=True,
                             env=env | {"PYTHONPATH": f"{root / 'platform'}:{root}"}, capture_output=True, text=True)  # fmt: skip
        self.info = json.loads(out.stdout.strip().splitlines()[-1])
        production = kind == "redis"
        self.api = Api(self.stack.url, self.info["token"], host=PUBLIC_HOST if production else "",
                       https_proxy=production)  # fmt: skip

    def start(
        self, *, beat_separately: bool = False, server: str = "gunicorn", workers: int | None = None
    ) -> None:
        """The web tier as production runs it (gunicorn, WEB_CONCURRENCY or the CPUs), or ``server``."""
        self.stack.start_web(server=server, workers=workers)
        self.stack.start_worker(self.stack.env["CELERY_QUEUE"], beat=not beat_separately)
        if beat_separately:
            self.stack.start_beat()
        self.cookie = self.api.login("bench", PASSWORD)

    def ws_url(self, run_id: int) -> tuple[str, dict[str, str]]:
        headers = {"Cookie": self.cookie}
        if self.api.host:
            headers |= {"Host": self.api.host, "Origin": f"https://{self.api.host}"}
        else:
            headers["Origin"] = self.stack.url
        return self.stack.url.replace("http", "ws", 1) + f"/ws/runs/{run_id}/", headers

    def close(self) -> None:
        self.stack.stop()
        subprocess.run([sys.executable, "manage.py", "ray_local", "stop"], cwd=ROOT, env=self.stack.env,
                       capture_output=True, timeout=120)  # fmt: skip
        if self.redis is not None:
            self.redis.stop()
            drop_postgres(self.db_name)
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(self.var_dir, ignore_errors=True)


def tiny_config(dep: Deployment, steps: int) -> dict[str, Any]:
    cfg = dep.api.get("/api/presets/demo-cpu")  # as the platform serves it: its model under a model root
    cfg["rollout"]["n"] = 4
    cfg["trainer"].update(total_steps=steps, batch_size=16, mini_batch_size=16)
    cfg["logging"] = {"sinks": ["stdout"]}
    return cfg


async def follow(
    session: Any, url: str, headers: dict[str, str], out: list[tuple[float, dict]], done: asyncio.Event
):
    async with session.ws_connect(url, headers=headers, heartbeat=None) as ws:
        while not done.is_set():
            try:
                frame = await asyncio.wait_for(ws.receive(), timeout=0.5)
            except TimeoutError:
                continue
            if frame.type.name != "TEXT":
                break
            out.append((time.time(), json.loads(frame.data)))


async def measure(dep: Deployment, steps: int, probe_batches: int) -> dict[str, Any]:
    import aiohttp

    api = dep.api
    exp = api.post(
        "/api/experiments",
        {"project": dep.info["project"], "name": "train", "config": tiny_config(dep, steps)},
    )
    run_id = api.post("/api/runs", {"experiment": exp["id"]})["id"]
    probe = dep.info["runs"][0]
    train_msgs: list[tuple[float, dict]] = []
    probe_msgs: list[tuple[float, dict]] = []
    done = asyncio.Event()
    sent: dict[int, float] = {}
    async with aiohttp.ClientSession() as session:
        followers = [asyncio.create_task(follow(session, *dep.ws_url(run_id), train_msgs, done)),
                     asyncio.create_task(follow(session, *dep.ws_url(probe), probe_msgs, done))]  # fmt: skip

        def trained_steps() -> int:
            return len({s for _, m in train_msgs if m.get("kind") == "metrics" for x in m["series"].values()
                        for s in x["steps"]})  # fmt: skip

        deadline = time.monotonic() + 300
        while trained_steps() < 1 and time.monotonic() < deadline:  # engine start-up
            await asyncio.sleep(0.2)
        headers = api.headers()
        for i in range(probe_batches):  # while the run trains
            body = {"points": [{"key": f"probe/{k}", "step": i, "value": float(k), "wall_time": time.time()}
                               for k in range(30)]}  # fmt: skip
            sent[i] = time.time()
            async with session.post(
                f"{api.base}/api/runs/{probe}/metrics", json=body, headers=headers
            ) as resp:
                resp.raise_for_status()
            await asyncio.sleep(max(0.0, sent[i] + 0.1 - time.time()))
        while time.monotonic() < deadline and not any(
            m.get("kind") == "event" and m["event"]["data"].get("to") in ("succeeded", "failed")
            for _, m in train_msgs
        ):
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        done.set()
        await asyncio.gather(*followers, return_exceptions=True)
    engine: dict[int, float] = {}
    sources: dict[str, int] = {}
    for t, m in train_msgs:
        if m.get("kind") != "metrics":
            continue
        sources[m.get("source", "live")] = sources.get(m.get("source", "live"), 0) + 1
        for x in m["series"].values():
            for step, wall in zip(x["steps"], x["wall_times"], strict=True):
                engine.setdefault(step, t - wall)
    probe_lat = {}
    for t, m in probe_msgs:
        for step in (m.get("series") or {}).get("probe/0", {}).get("steps", []):
            probe_lat.setdefault(step, t - sent[step])
    state = [m["event"]["data"].get("to") for _, m in train_msgs if m.get("kind") == "event"
             and m["event"]["kind"] == "status"]  # fmt: skip
    return {
        "engine_to_browser": summary([v for s, v in engine.items() if s > 10]),
        "post_to_websocket": summary(list(probe_lat.values())),
        "probe_batches_received": len(probe_lat),
        "train_steps_received": len(engine),
        "train_messages_by_source": sources,
        "train_final_state": state[-1] if state else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deployments", default="redis,embedded")
    p.add_argument("--flush", default="0.05,0.5", help="sink flush intervals to compare (s)")
    p.add_argument("--steps", type=int, default=300, help="training steps (>= 200 measured)")
    p.add_argument("--probe-batches", type=int, default=250)
    p.add_argument(
        "--smoke", action="store_true", help="the redis deployment (embedded: follow_latency's), 12 steps"
    )
    args = p.parse_args()
    if args.smoke:  # the code paths of the full run at tiny sizes (run_all.py --smoke): figures mean nothing
        args.deployments, args.flush, args.steps, args.probe_batches = "redis", "0.05", 12, 3
    results = []
    for kind in args.deployments.split(","):
        for flush in (float(f) for f in args.flush.split(",")):
            load_before = os.getloadavg()[0]
            dep = Deployment(kind, flush)
            try:
                dep.start()
                result = asyncio.run(measure(dep, args.steps, args.probe_batches))
            finally:
                dep.close()
            result |= {"deployment": kind, "flush_s": flush, "load_before": round(load_before, 1),
                       "load_after": round(os.getloadavg()[0], 1)}  # fmt: skip
            print(json.dumps(result), flush=True)
            results.append(result)
    print(
        "\n| deployment | sink flush | engine → browser p50 / p95 / max (steps) | POST → websocket p50 / p95 / max"
        " (batches) | load |\n|---|---|---|---|---|"
    )
    for r in results:
        e, w = r["engine_to_browser"], r["post_to_websocket"]
        print(
            f"| {r['deployment']} | {r['flush_s']} s | {e.get('p50_ms')} / {e.get('p95_ms')} / {e.get('max_ms')} ms"
            f" ({e['n']}) | {w.get('p50_ms')} / {w.get('p95_ms')} / {w.get('max_ms')} ms ({w['n']}) |"
            f" {r['load_before']}-{r['load_after']} |"
        )


if __name__ == "__main__":
    main()

"""Load on the production stack: many runs ingesting while many browsers follow them.

    .venv/bin/python benchmarks/live_load.py                      # sinks mode: before vs after, ~5 min
    .venv/bin/python benchmarks/live_load.py --mode saturate      # req/s and CPU per request at saturation
    .venv/bin/python benchmarks/live_load.py --mode fixed         # the fixed-rate phases (poll comparison)
    .venv/bin/python benchmarks/live_load.py --quick              # a smoke run of the sinks mode
    .venv/bin/python benchmarks/live_load.py --smoke              # this tree only, 1 run, 1 client, 2 s

Loopback only, bounded in count and time. Each configuration gets a fresh stack (benchmarks/
live_latency.py's ``redis`` deployment: a scratch PostgreSQL database, a private redis-server, a Celery
worker and beat, DEBUG off) with ``--runs`` runs. ``--configs`` lists the stacks compared side by side,
``[REF@]SERVER:WORKERS`` each: ``gunicorn:2`` is production's web tier (gunicorn managing 2 uvicorn
workers) on this source tree; ``daphne:1`` one daphne process; a ``REF@`` prefix runs that git commit's
tree instead (exported to a scratch folder), its platform *and* its engine sink. The default "before",
``a55cc87@daphne:1``, is the last commit before the web tier changed: one daphne process and the
engine sink that opened a new connection per POST (urllib).

Modes:

- ``sinks`` (default): the engine's real ``HttpSink``, one per run (``--runs``, 20), each logging a step
  of 30 keys every ``--step-ms`` (40 ms) and 4 samples a second, in a process of their own, while
  ``--clients`` (100) logged-in websocket clients follow the runs (spread evenly), offering
  permessage-deflate as browsers do (``--ws-compress``, 0: not offered). Reported: sink
  requests and failures, delivery completeness (every step of every run at every follower, counted
  after the sinks closed and ``--drain`` seconds), engine → browser (receipt minus the point's
  wall_time), POST → websocket (receipt minus the time the sink sent the request carrying the step),
  and the web tier's CPU.
- ``saturate``: ingestion alone, ``--connections`` keep-alive clients posting back to back for
  ``--seconds``, 30-point batches then 1000-point batches: requests/s and points/s served, web CPU per
  request.
- ``fixed``: today's fixed-rate feed (a 30-point batch every 100 ms, an event batch a second, a
  heartbeat every 5 s per run) in three phases: ingestion alone, followers with the consumers' poll at
  its default, and polling every 1.5 s; POST → websocket and the live-update database reads.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from live_latency import Deployment, pct  # noqa: E402

LIVE_READ_INDEXES = ("tracking_metricpoint_pkey", "uniq_event_seq")
BEFORE = "a55cc87"  # the last commit with one daphne process and the urllib sink


def index_scans(db_name: str) -> int:
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port=5432 user=postgres dbname={db_name}") as conn:
        rows = conn.execute(
            "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes WHERE indexrelname = ANY(%s)",
            [list(LIVE_READ_INDEXES)],
        ).fetchone()
    return int(rows[0])


class Config:
    """``[REF@]SERVER:WORKERS``; ``root`` is this tree or REF's, exported."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        ref, _, rest = spec.rpartition("@")
        server, _, workers = rest.partition(":")
        self.ref, self.server, self.workers = ref or None, server, int(workers or 1)
        self.root = ROOT
        self._scratch: str | None = None

    def __enter__(self) -> Config:
        if self.ref:
            known = subprocess.run(
                ["git", "cat-file", "-e", f"{self.ref}^{{commit}}"], cwd=ROOT, capture_output=True
            )
            if known.returncode != 0:
                raise SystemExit(
                    f"error: commit {self.ref} is not in this clone (a shallow one?): leave it out of --configs"
                )
            self._scratch = tempfile.mkdtemp(prefix="rlp-load-src-", dir="/tmp")
            archive = subprocess.run(["git", "archive", self.ref], cwd=ROOT, check=True, capture_output=True)
            subprocess.run(["tar", "-x", "-C", self._scratch], input=archive.stdout, check=True)
            self.root = Path(self._scratch)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def deployment(self, runs: int, poll: str | None = None) -> Deployment:
        dep = Deployment("redis", 0.05, probe_runs=runs, root=self.root)
        if poll:
            dep.stack.env["LIVE_POLL_INTERVAL_S"] = poll
        dep.start(beat_separately=True, server=self.server, workers=self.workers)
        return dep


def web_cpu(dep: Deployment) -> float:
    return dep.stack.cpu_seconds("web")


# --- followers ----------------------------------------------------------------------------------------


async def follow(session: Any, dep: Deployment, run_id: int, stop: list[float], seen: dict[int, float],
                 stats: dict[str, Any], compress: int) -> None:  # fmt: skip
    """Record the receipt time of each step of ``load/k00`` (sinks) or ``load/0`` (fixed) at this follower,
    which offers permessage-deflate with a ``compress``-bit window as browsers do (15; 0: not offered)."""
    url, headers = dep.ws_url(run_id)
    async with session.ws_connect(url, headers=headers, heartbeat=None, max_msg_size=0,
                                  compress=compress) as ws:  # fmt: skip
        while time.monotonic() < stop[0]:
            try:
                frame = await asyncio.wait_for(ws.receive(), timeout=0.5)
            except TimeoutError:
                continue
            if frame.type.name != "TEXT":
                stats["closed"] += 1
                return
            received = time.time()
            msg = json.loads(frame.data)
            if msg.get("kind") != "metrics":
                continue
            series = msg["series"].get("load/k00") or msg["series"].get("load/0")
            if series:
                stats["by_poll" if msg.get("source") == "poll" else "by_layer"] += len(series["steps"])
                for step, wall in zip(series["steps"], series["wall_times"], strict=True):
                    seen.setdefault(step, received)
                    stats["engine_lat"].append(received - wall)


# --- sinks mode -----------------------------------------------------------------------------------------


async def sinks_phase(dep: Deployment, cfg: Config, args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp
    from _load_sinks import run_sinks

    runs, tokens = dep.info["runs"], dep.info["ingest"]
    stats: dict[str, Any] = {"closed": 0, "engine_lat": [], "by_layer": 0, "by_poll": 0}
    seen: list[dict[int, float]] = [{} for _ in range(args.clients)]
    stop = [time.monotonic() + 3600]
    spool = tempfile.mkdtemp(prefix="rlp-load-spool-", dir="/tmp")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        followers = [asyncio.create_task(follow(session, dep, runs[i % len(runs)], stop, seen[i], stats,
                                                args.ws_compress))
                     for i in range(args.clients)]  # fmt: skip
        await asyncio.sleep(3)  # every follower connected and caught up
        cpu0, t0, own0 = web_cpu(dep), time.monotonic(), time.process_time()
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
            engine = await asyncio.get_running_loop().run_in_executor(
                pool, run_sinks, str(cfg.root), dep.stack.url, runs, tokens, args.seconds, args.step_ms / 1000,
                spool,
            )  # fmt: skip
        cpu, elapsed = web_cpu(dep) - cpu0, time.monotonic() - t0
        followers_cpu = time.process_time() - own0  # this process runs the 100 followers
        sinks_cpu = engine.pop("_cpu_s")

        def missing() -> int:
            return sum(engine[str(runs[i % len(runs)])]["steps"] - len(seen[i]) for i in range(args.clients))

        drain_until = time.monotonic() + args.drain
        while missing() > 0 and time.monotonic() < drain_until:
            await asyncio.sleep(0.2)
        stop[0] = 0
        await asyncio.gather(*followers, return_exceptions=True)
    shutil.rmtree(spool, ignore_errors=True)
    post_lat = [seen[i][s] - float(t) for i in range(args.clients)
                for s, t in ((int(k), v) for k, v in engine[str(runs[i % len(runs)])]["sent"].items())
                if s in seen[i]]  # fmt: skip
    requests = sum(sum(e["requests"].values()) for e in engine.values())
    expected = sum(engine[str(runs[i % len(runs)])]["steps"] for i in range(args.clients))
    eng = [v * 1000 for v in stats["engine_lat"]]
    post = [v * 1000 for v in post_lat]
    return {
        "requests": requests,
        "failed_requests": sum(sum(e["failed"].values()) for e in engine.values()),
        "failures": _merged(e["failed"] for e in engine.values()),
        "undelivered_bytes": sum(e["undelivered_bytes"] for e in engine.values()),
        "points_per_request": round(
            sum(e["steps"] for e in engine.values())
            * 30
            / max(1, sum(e["requests"].get("metrics", 0) for e in engine.values()))
        ),
        "delivered": expected - missing(),
        "expected": expected,
        "engine_to_browser_p50_ms": round(statistics.median(eng)) if eng else None,
        "engine_to_browser_p95_ms": round(pct(eng, 0.95)) if eng else None,
        "post_to_ws_p50_ms": round(statistics.median(post)) if post else None,
        "post_to_ws_p95_ms": round(pct(post, 0.95)) if post else None,
        "sockets_closed": stats["closed"],
        "received_by_layer": stats["by_layer"],  # (follower, step) receipts: live through the bus
        "received_by_poll": stats["by_poll"],  # ... and from the consumers' database poll
        "web_cpu_pct": round(100 * cpu / elapsed),
        "web_cpu_ms_per_request": round(1000 * cpu / max(1, requests), 2),
        "sinks_cpu_pct": round(100 * sinks_cpu / elapsed),  # the load generators' own CPU (same cores)
        "followers_cpu_pct": round(100 * followers_cpu / elapsed),
        "seconds": round(elapsed, 1),
    }


def _merged(counts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:5])


# --- saturate mode -------------------------------------------------------------------------------------


async def saturate_phase(dep: Deployment, args: argparse.Namespace, batch: int) -> dict[str, Any]:
    import aiohttp

    runs, tokens = dep.info["runs"], dep.info["ingest"]
    done = {"requests": 0, "errors": 0}

    async def client(i: int, stop: float) -> None:
        run, token = runs[i % len(runs)], tokens[i % len(runs)]
        url, headers = f"{dep.stack.url}/api/runs/{run}/metrics", {"Authorization": f"Token {token}"}
        step = i * 10_000_000 + batch * 100_000  # every batch new points
        async with aiohttp.ClientSession() as session:  # one keep-alive connection per client
            while time.monotonic() < stop:
                now = time.time()
                body = {"points": [{"key": f"sat/{k % 30}", "step": step + k // 30, "value": 1.0, "wall_time": now}
                                   for k in range(batch)]}  # fmt: skip
                step += batch // 30 + 1
                async with session.post(url, json=body, headers=headers) as resp:
                    await resp.read()
                    done["requests" if resp.status < 300 else "errors"] += 1

    await asyncio.gather(*(client(i, time.monotonic() + 2) for i in range(args.connections)))  # warm up
    done.update(requests=0, errors=0)
    cpu0, t0 = web_cpu(dep), time.monotonic()
    await asyncio.gather(*(client(i, t0 + args.seconds) for i in range(args.connections)))
    cpu, elapsed = web_cpu(dep) - cpu0, time.monotonic() - t0
    return {
        "batch": batch,
        "requests_per_s": round(done["requests"] / elapsed, 1),
        "points_per_s": round(done["requests"] * batch / elapsed),
        "errors": done["errors"],
        "web_cpu_pct": round(100 * cpu / elapsed),
        "web_cpu_ms_per_request": round(1000 * cpu / max(1, done["requests"]), 2),
    }


# --- fixed mode (the fixed-rate feed) ------------------------------------------------------------------


async def ingest(session: Any, dep: Deployment, run_id: int, stop: float, stats: dict[str, Any]) -> None:
    """One run's reporter: 30 points / 100 ms, one event batch / s, one heartbeat / 5 s."""
    base, headers = f"{dep.api.base}/api/runs/{run_id}", dep.api.headers()
    step = 0
    next_at = time.monotonic()
    while time.monotonic() < stop:
        now = time.time()
        calls = [("metrics", {"points": [{"key": f"load/{k}", "step": step, "value": k * 0.1, "wall_time": now}
                                         for k in range(30)]})]  # fmt: skip
        if step % 10 == 0:
            calls.append(("events", {"events": [{"kind": "log", "message": f"step {step}"}],
                                     "batch_id": f"b{run_id}-{step}"}))  # fmt: skip
        if step % 50 == 0:
            calls.append(("heartbeat", {}))
        stats["sent"][(run_id, step)] = now  # before the POST: its live message may beat the reply
        for endpoint, body in calls:
            try:
                async with session.post(f"{base}/{endpoint}", json=body, headers=headers) as resp:
                    answer = await resp.read()
                    error = "" if resp.status < 300 else f"HTTP {resp.status} {endpoint}: {answer[:200]!r}"
            except Exception as exc:
                error = f"{type(exc).__name__} {endpoint}: {exc}"
            stats["requests"] += 1
            if error:
                stats["errors"] += 1
                stats["error_kinds"][error[:60]] = stats["error_kinds"].get(error[:60], 0) + 1
        step += 1
        next_at += 0.1
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def fixed_phase(dep: Deployment, clients: int, seconds: float, compress: int) -> dict[str, Any]:
    import aiohttp

    runs = dep.info["runs"]
    stats: dict[str, Any] = {"requests": 0, "errors": 0, "closed": 0, "sent": {}, "error_kinds": {},
                             "engine_lat": []}  # fmt: skip
    seen: list[dict[int, float]] = [{} for _ in range(clients)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        stop = [time.monotonic() + 3 + seconds]
        followers = [asyncio.create_task(follow(session, dep, runs[i % len(runs)], stop, seen[i], stats,
                                                compress))
                     for i in range(clients)]  # fmt: skip
        await asyncio.sleep(3)
        scans0, cpu0, t0 = index_scans(dep.db_name), web_cpu(dep), time.monotonic()
        await asyncio.gather(*(ingest(session, dep, r, stop[0], stats) for r in runs))
        elapsed = time.monotonic() - t0
        scans, cpu = index_scans(dep.db_name) - scans0, web_cpu(dep) - cpu0
        await asyncio.gather(*followers, return_exceptions=True)
    lat = [1000 * (t - stats["sent"][(runs[i % len(runs)], s)]) for i in range(clients) for s, t in seen[i].items()
           if (runs[i % len(runs)], s) in stats["sent"]]  # fmt: skip
    return {
        "requests": stats["requests"],
        "errors": stats["errors"],
        "error_kinds": stats["error_kinds"],
        "sockets_closed": stats["closed"],
        "deliveries": len(lat),
        "expected_deliveries": len(stats["sent"]) * clients // len(runs),
        "post_to_ws_p50_ms": round(statistics.median(lat)) if lat else None,
        "post_to_ws_p95_ms": round(pct(lat, 0.95)) if lat else None,
        "live_db_reads_per_s": round(scans / elapsed, 1),
        "web_cpu_pct": round(100 * cpu / elapsed),
        "web_cpu_ms_per_request": round(1000 * cpu / max(1, stats["requests"]), 2),
        "seconds": round(elapsed, 1),
    }


# --- main ----------------------------------------------------------------------------------------------


def measured(cfg: Config, runs: int, body: Any, poll: str | None = None) -> list[dict[str, Any]]:
    load_before = os.getloadavg()[0]
    dep = cfg.deployment(runs, poll)
    try:
        results = body(dep)
    finally:
        dep.close()
    for r in results:
        r |= {
            "config": cfg.spec,
            "load_before": round(load_before, 1),
            "load_after": round(os.getloadavg()[0], 1),
        }
        print(json.dumps(r), flush=True)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("sinks", "saturate", "fixed"), default="sinks")
    p.add_argument("--configs", default=None, help=f"default: {BEFORE}@daphne:1,gunicorn:1,gunicorn:2")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--step-ms", type=float, default=40.0, help="sinks: the engine's step period")
    p.add_argument("--drain", type=float, default=15.0, help="sinks: seconds to wait for late deliveries")
    p.add_argument("--connections", type=int, default=8, help="saturate: concurrent clients")
    p.add_argument("--ws-compress", type=int, default=15,
                   help="followers offer permessage-deflate with this window (browsers: 15; 0: not offered)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="a smoke run: 3 runs, 6 clients, 5 s")
    p.add_argument("--smoke", action="store_true", help="seconds: this tree's gunicorn:1, 1 run, 1 client")
    args = p.parse_args()
    if args.quick:
        args.runs, args.clients, args.seconds, args.drain, args.connections = 3, 6, 5.0, 10.0, 2
    if args.smoke:
        args.runs, args.clients, args.seconds, args.drain, args.connections = 1, 1, 2.0, 3.0, 1
    specs = (args.configs or f"{BEFORE}@daphne:1,gunicorn:1,gunicorn:2").split(",")
    if args.quick and not args.configs:
        specs = [f"{BEFORE}@daphne:1", "gunicorn:2"]
    if args.smoke and not args.configs:
        specs = ["gunicorn:1"]
    results: list[dict[str, Any]] = []
    for spec in specs:
        with Config(spec) as cfg:
            if args.mode == "sinks":
                results += measured(cfg, args.runs, lambda d, c=cfg: [asyncio.run(sinks_phase(d, c, args))])
            elif args.mode == "saturate":
                results += measured(
                    cfg, args.runs, lambda d: [asyncio.run(saturate_phase(d, args, b)) for b in (30, 1000)]
                )
            else:
                for name, clients, poll in [("ingestion only", 0, None), ("followers", args.clients, None),
                                            ("followers, poll every 1.5 s", args.clients, "1.5")]:  # fmt: skip
                    for r in measured(
                        cfg,
                        args.runs,
                        lambda d, n=clients: [asyncio.run(fixed_phase(d, n, args.seconds, args.ws_compress))],
                        poll,
                    ):
                        results.append(r | {"phase": name})
    print_table(args.mode, results)


def print_table(mode: str, results: list[dict[str, Any]]) -> None:
    load = lambda r: f"{r['load_before']}-{r['load_after']}"  # noqa: E731
    if mode == "sinks":
        print("\n| web tier | sink requests (failed) | points/request | delivered / expected | received live / by poll"
              " | engine → browser p50 / p95 | POST → ws p50 / p95 | web CPU | web CPU per request"
              " | sinks / followers CPU | load |\n|---|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
        for r in results:
            print(f"| {r['config']} | {r['requests']} ({r['failed_requests']}) | {r['points_per_request']} |"
                  f" {r['delivered']} / {r['expected']} | {r['received_by_layer']} / {r['received_by_poll']} |"
                  f" {r['engine_to_browser_p50_ms']} / {r['engine_to_browser_p95_ms']} ms |"
                  f" {r['post_to_ws_p50_ms']} / {r['post_to_ws_p95_ms']} ms | {r['web_cpu_pct']} % |"
                  f" {r['web_cpu_ms_per_request']} ms | {r['sinks_cpu_pct']} / {r['followers_cpu_pct']} % |"
                  f" {load(r)} |")  # fmt: skip
    elif mode == "saturate":
        print("\n| web tier | batch | requests/s | points/s | errors | web CPU | web CPU per request | load |"
              "\n|---|---|---|---|---|---|---|---|")  # fmt: skip
        for r in results:
            print(f"| {r['config']} | {r['batch']} | {r['requests_per_s']} | {r['points_per_s']:,} | {r['errors']} |"
                  f" {r['web_cpu_pct']} % | {r['web_cpu_ms_per_request']} ms | {load(r)} |")  # fmt: skip
    else:
        print("\n| web tier | phase | requests (errors) | POST → ws p50 / p95 | deliveries / expected | DB reads/s"
              " | web CPU | per request | load |\n|---|---|---|---|---|---|---|---|---|")  # fmt: skip
        for r in results:
            print(f"| {r['config']} | {r['phase']} | {r['requests']} ({r['errors']}) | {r['post_to_ws_p50_ms']} /"
                  f" {r['post_to_ws_p95_ms']} ms | {r['deliveries']} / {r['expected_deliveries']} |"
                  f" {r['live_db_reads_per_s']} | {r['web_cpu_pct']} % | {r['web_cpu_ms_per_request']} ms | {load(r)} |")  # fmt: skip


if __name__ == "__main__":
    main()

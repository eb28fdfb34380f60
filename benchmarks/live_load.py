"""Load on the production stack: many runs ingesting while many browsers follow them.

    .venv/bin/python benchmarks/live_load.py                       # 20 runs, 100 websocket clients, 30 s a phase
    .venv/bin/python benchmarks/live_load.py --runs 5 --clients 20 --seconds 10

Loopback only, bounded in count and time. The stack (benchmarks/live_latency.py's ``redis`` deployment: a
scratch PostgreSQL database, a private redis-server, daphne, a Celery worker and beat, DEBUG off) gets
``--runs`` runs, each fed like the engine's sink does: a batch of 30 points every 100 ms and an event
batch (with a batch id) every second, plus a heartbeat every 5 s; ``--clients`` logged-in websocket
clients follow them (spread evenly). Every client, ingester and follower runs in this one process's
event loop.

Three phases of ``--seconds`` each, the stack restarted for each: ingestion alone; ingestion and the
followers with the consumers' database poll at its deployment default (10 s with Redis); the same with
the poll every 1.5 s (the old default, for comparison). Reported: ingestion errors, POST → websocket
latency (receipt minus send time, for every batch at every follower), the database reads spent on live
updates per second (index scans of the two indexes the consumers read by, metric points by id and
events by run and seq, beyond what the ingestion-only phase shows), and the CPU of the web and worker
processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from live_latency import Deployment, pct  # noqa: E402

LIVE_READ_INDEXES = ("tracking_metricpoint_pkey", "uniq_event_seq")


def index_scans(db_name: str) -> int:
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port=5432 user=postgres dbname={db_name}") as conn:
        rows = conn.execute(
            "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes WHERE indexrelname = ANY(%s)",
            [list(LIVE_READ_INDEXES)],
        ).fetchone()
    return int(rows[0])


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


async def follow(session: Any, dep: Deployment, run_id: int, stop: float, stats: dict[str, Any]) -> None:
    url, headers = dep.ws_url(run_id)
    async with session.ws_connect(url, headers=headers, heartbeat=None) as ws:
        while time.monotonic() < stop:
            try:
                frame = await asyncio.wait_for(ws.receive(), timeout=0.5)
            except TimeoutError:
                continue
            if frame.type.name != "TEXT":
                stats["closed"] += 1
                return
            received = time.time()
            msg = json.loads(frame.data)
            if msg.get("kind") == "metrics" and "load/0" in msg["series"]:
                for step in msg["series"]["load/0"]["steps"]:
                    sent = stats["sent"].get((run_id, step))
                    if sent is not None:
                        stats["latency"].append(received - sent)


async def phase(dep: Deployment, runs: list[int], clients: int, seconds: float) -> dict[str, Any]:
    import aiohttp

    stats: dict[str, Any] = {
        "requests": 0,
        "errors": 0,
        "closed": 0,
        "sent": {},
        "latency": [],
        "error_kinds": {},
    }
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        stop = time.monotonic() + 3 + seconds
        followers = [
            asyncio.create_task(follow(session, dep, runs[i % len(runs)], stop, stats))
            for i in range(clients)
        ]
        await asyncio.sleep(3)  # every follower connected and caught up
        scans0, cpu0, t0 = (
            index_scans(dep.db_name),
            {n: dep.stack.cpu_seconds(n) for n in ("web", "worker")},
            time.monotonic(),
        )
        stats["latency"].clear()
        await asyncio.gather(*(ingest(session, dep, r, stop, stats) for r in runs))
        elapsed = time.monotonic() - t0
        scans, cpu = index_scans(dep.db_name) - scans0, {n: dep.stack.cpu_seconds(n) - cpu0[n] for n in cpu0}
        await asyncio.gather(*followers, return_exceptions=True)
    lat = [v * 1000 for v in stats["latency"]]
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
        "web_cpu_pct": round(100 * cpu["web"] / elapsed),
        "worker_cpu_pct": round(100 * cpu["worker"] / elapsed),
        "seconds": round(elapsed, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args()
    phases = [("ingestion only", 0, None), ("followers, poll at the default", args.clients, None),
              ("followers, poll every 1.5 s", args.clients, "1.5")]  # fmt: skip
    results = []
    for name, clients, poll in phases:
        load_before = os.getloadavg()[0]
        dep = Deployment("redis", 0.05, probe_runs=args.runs)
        if poll:
            dep.stack.env["LIVE_POLL_INTERVAL_S"] = poll
        try:
            dep.start(beat_separately=True)
            result = asyncio.run(phase(dep, dep.info["runs"], clients, args.seconds))
        finally:
            dep.close()
        result |= {
            "phase": name,
            "load_before": round(load_before, 1),
            "load_after": round(os.getloadavg()[0], 1),
        }
        print(json.dumps(result), flush=True)
        results.append(result)
    print(
        "\n| phase | requests (errors) | POST → ws p50 / p95 | deliveries / expected | live-update DB reads/s"
        " | web CPU | worker CPU | load |\n|---|---|---|---|---|---|---|---|"
    )
    base = results[0]["live_db_reads_per_s"]
    for r in results:
        r["live_db_reads_per_s"] = round(r["live_db_reads_per_s"] - base, 1) if r is not results[0] else 0.0
        print(
            f"| {r['phase']} | {r['requests']} ({r['errors']}) | {r['post_to_ws_p50_ms']} / {r['post_to_ws_p95_ms']} ms"
            f" | {r['deliveries']} / {r['expected_deliveries']} | {r['live_db_reads_per_s']} | {r['web_cpu_pct']} %"
            f" | {r['worker_cpu_pct']} % | {r['load_before']}-{r['load_after']} |"
        )


if __name__ == "__main__":
    main()

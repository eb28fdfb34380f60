"""Where the web tier's CPU goes on a metrics POST: py-spy samples one production web process.

    .venv/bin/python benchmarks/ingest_profile.py                          # this tree, 30-point batches
    .venv/bin/python benchmarks/ingest_profile.py --configs 011ba3e@gunicorn:1,gunicorn:1 --batch 1000
    .venv/bin/python benchmarks/ingest_profile.py --smoke     # one client for 2 s: a check that it runs

For each configuration (``[REF@]SERVER:WORKERS``, as benchmarks/live_load.py) a fresh production stack
(PostgreSQL, a private redis-server, a worker and beat, DEBUG off; one web process) serves
``--connections`` keep-alive clients posting ``--batch``-point metrics batches back to back while
``py-spy record --gil`` samples the web process for ``--seconds``: only the thread holding the GIL,
i.e. Python at work (a thread blocked on a socket or the database releases it; without ``--gil`` those
waits count as busy and swamp the picture). Each sample is put in the first bucket (``BUCKETS``, in
order) whose function appears in its stack; reported: requests served, web CPU per request (from
/proc, as live_load.py: every thread, kernel time included) and each bucket's share of the samples
scaled to that total (so the C parts that run without the GIL are spread over the buckets). py-spy itself needs ``ptrace``
(root, or ``kernel.yama.ptrace_scope`` 0); the sampling costs the process a little.

``--flame DIR`` also keeps each configuration's collapsed stacks (``DIR/<config>.txt``, one
``frame;frame;... count`` line per distinct stack: feed them to flamegraph.pl or speedscope).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from live_load import Config  # noqa: E402

# (bucket, substrings of a frame "function (file)"; the first bucket with a match in a sample's stack
# takes it). Order matters: the narrower layers first.
BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    ("live publish (build + hand-off)", ("publish (tracking/live.py", "_metrics_payload", "live_metrics")),
    ("live send (the bus, on the loop)", ("drain (tracking/live.py", "publish (tracking/bus.py")),
    ("SQL: the ingest statement", ("_insert_postgres",)),
    (
        "token authentication (SQL)",
        ("authenticate (accounts/authentication.py", "ingest_token (accounts/authentication.py"),
    ),
    ("throttle (Redis)", ("allow_request", "check_throttles", "allow_ingest_token")),
    (
        "JSON parse + wire validation",
        (
            "_parse (tracking/api.py",
            "NulSafeJSONParser",
            "parse (rl_engine/wire",
            "json_problem",
            "_load_data_and_files",
            "parse (accounts/parsers.py",
        ),
    ),
    ("response rendering", ("finalize_response", "render (", "rendered_content")),
    ("view / front (other)", ("dispatch (rest_framework/views.py", "serve (tracking/ingest.py")),
    (
        "DB connection (pool get/put, close_old_connections)",
        ("close_old_connections", "ensure_connection", "putconn", "getconn", "close (django/db"),
    ),
    ("middleware", ("middleware", "MiddlewareMixin")),
    ("Django request/response (ASGI handler)", ("django/core/handlers",)),
    ("asgiref thread hops", ("asgiref",)),
    ("uvicorn HTTP (parse, send)", ("uvicorn",)),
    ("event loop (other)", ("asyncio", "uvloop", "run_forever")),
]


def bucket_of(stack: str) -> str:
    for name, needles in BUCKETS:
        if any(n in stack for n in needles):
            return name
    return "other"


async def post_back_to_back(url: str, token: str, batch: int, seconds: float, base_step: int) -> int:
    import aiohttp

    served, step, stop = 0, base_step, time.monotonic() + seconds
    headers = {"Authorization": f"Token {token}"}
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < stop:
            now = time.time()
            body = {"points": [{"key": f"prof/{k % 30}", "step": step + k // 30, "value": 1.0, "wall_time": now}
                               for k in range(batch)]}  # fmt: skip
            step += batch // 30 + 1
            async with session.post(url, json=body, headers=headers) as resp:
                await resp.read()
                if resp.status >= 300:
                    raise SystemExit(f"error: HTTP {resp.status}: {(await resp.text())[:300]}")
                served += 1
    return served


async def load(dep: Any, args: argparse.Namespace, seconds: float, base: int) -> int:
    runs, tokens = dep.info["runs"], dep.info["ingest"]
    counts = await asyncio.gather(*(
        post_back_to_back(f"{dep.stack.url}/api/runs/{runs[i % len(runs)]}/metrics", tokens[i % len(runs)],
                          args.batch, seconds, base + i * 10_000_000)
        for i in range(args.connections)))  # fmt: skip
    return sum(counts)


def profile(cfg: Config, args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    dep = cfg.deployment(runs=args.connections)
    out = Path(tempfile.mkdtemp(prefix="rlp-prof-", dir="/tmp"))
    try:
        (pid,) = dep.stack.web_pids()
        asyncio.run(load(dep, args, 3, 0))  # warm up
        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--rate",
                                str(args.rate), "--format", "raw", "--output", str(out / "stacks.txt"),
                                "--duration", str(int(args.seconds)), "--nonblocking", "--gil"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        time.sleep(1)  # py-spy attached
        cpu0 = dep.stack.cpu_seconds("web")
        t0 = time.monotonic()
        requests = asyncio.run(load(dep, args, args.seconds - 2, 1_000_000))
        cpu, elapsed = dep.stack.cpu_seconds("web") - cpu0, time.monotonic() - t0
        _, err = spy.communicate(timeout=60)
        if spy.returncode != 0:
            raise SystemExit(f"error: py-spy failed: {err.decode(errors='replace')[-500:]}")
        stacks = (out / "stacks.txt").read_text().splitlines()
        if args.flame:
            Path(args.flame).mkdir(parents=True, exist_ok=True)
            shutil.copy(out / "stacks.txt", Path(args.flame) / f"{cfg.spec.replace('/', '_')}.txt")
    finally:
        dep.close()
        shutil.rmtree(out, ignore_errors=True)
    samples: dict[str, int] = {}
    for line in stacks:
        stack, _, count = line.rpartition(" ")
        samples[bucket_of(stack)] = samples.get(bucket_of(stack), 0) + int(count)
    total = sum(samples.values()) or 1
    per_request = 1000 * cpu / max(1, requests)
    return {
        "config": cfg.spec,
        "batch": args.batch,
        "requests": requests,
        "requests_per_s": round(requests / elapsed, 1),
        "web_cpu_ms_per_request": round(per_request, 2),
        "samples": total,
        "buckets_ms": {
            k: round(per_request * v / total, 2) for k, v in sorted(samples.items(), key=lambda kv: -kv[1])
        },
        "load_before": round(load_before, 1),
        "load_after": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--configs", default="gunicorn:1", help="[REF@]SERVER:WORKERS, comma-separated (one worker)"
    )
    p.add_argument("--batch", type=int, default=30)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--flame", default="", help="keep the collapsed stacks in this folder")
    p.add_argument("--smoke", action="store_true", help="one client for 2 s, 50 samples a second")
    args = p.parse_args()
    if args.smoke:  # the code paths of the full run at tiny sizes (run_all.py --smoke): figures mean nothing
        args.connections, args.seconds, args.rate = 1, 2.0, 50
    results = []
    for spec in args.configs.split(","):
        with Config(spec) as cfg:
            if cfg.workers != 1:
                raise SystemExit("error: profile one web process (SERVER:1)")
            results.append(profile(cfg, args))
            print(json.dumps(results[-1]), flush=True)
    names = [n for n, _ in BUCKETS] + ["other"]
    print("\n| where (ms of web CPU per request) | " + " | ".join(r["config"] for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for name in names:
        if any(name in r["buckets_ms"] for r in results):
            print(f"| {name} | " + " | ".join(f"{r['buckets_ms'].get(name, 0):.2f}" for r in results) + " |")
    print(
        "| **total (from /proc)** | "
        + " | ".join(f"**{r['web_cpu_ms_per_request']:.2f}**" for r in results)
        + " |"
    )
    print("| requests/s | " + " | ".join(str(r["requests_per_s"]) for r in results) + " |")


if __name__ == "__main__":
    main()

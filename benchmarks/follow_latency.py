"""``rlp run follow`` latency on a running demo run: engine → terminal, beside engine → browser.

    .venv/bin/python benchmarks/follow_latency.py                          # embedded default, 300 steps
    .venv/bin/python benchmarks/follow_latency.py --deployments redis,embedded
    .venv/bin/python benchmarks/follow_latency.py --steps 40               # a short check
    .venv/bin/python benchmarks/follow_latency.py --source post            # the platform's part, no engine
    .venv/bin/python benchmarks/follow_latency.py --smoke                  # embedded, 12 steps: a check

A fresh stack per deployment (benchmarks/live_latency.py's ``Deployment``: daphne, a Celery worker with
its beat, the platform's local Ray head, a scratch VAR_DIR; ``redis`` is PostgreSQL + a private Redis with
DEBUG off). A tiny ``demo-cpu`` run (16 samples a step) is launched through the REST API and, once it
trains, followed by two clients at once: the CLI as a user runs it (``python -m rlp_client run follow RUN
--json``, a child process authenticated by an API token, each metric printed as a line on its stdout),
and the browser's path (a websocket with the session cookie, as ``live_latency.py`` measures it).

Latency of a point = the time its line is read from the CLI's stdout (or the websocket frame received)
minus its ``wall_time`` (the engine's clock when it logged the step; same machine). Points the CLI read
back from the database when it started (logged before the follow began) and the engine's first 10 steps
are left out. Figures per point and per step (a step's points travel together), p50 / p95 / max.

On the ``redis`` deployment the CLI talks plain HTTP to daphne on loopback (a sidecar's view): the stack
gets ``127.0.0.1`` among its allowed hosts and no HTTPS redirect; the browser path goes through the
public host name with the proxy's header, as in live_latency.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from live_latency import PUBLIC_HOST, Deployment, summary, tiny_config  # noqa: E402

from scripts.platform_stack import Follower  # noqa: E402

SKIP_STEPS = 10


class CliFollower:
    """``python -m rlp_client run follow RUN --json`` in a child process; (receipt time, line) per line."""

    def __init__(self, url: str, token: str, run_id: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLP_")} | {
            "RLP_URL": url,
            "RLP_TOKEN": token,
        }
        self.proc = subprocess.Popen([sys.executable, "-m", "rlp_client", "run", "follow", str(run_id), "--json"],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     bufsize=1)  # fmt: skip
        self.started = time.time()
        self.lines: list[tuple[float, dict[str, Any]]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.time()
            self.lines.append((now, json.loads(line)))

    def wait(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout=timeout_s)
        self.thread.join(timeout=10)
        return code


def latencies(
    pairs: list[tuple[float, str, int, float]], since: float, skip_steps: int = SKIP_STEPS
) -> tuple[list[float], list[float]]:
    """(per point, per step) from (receipt, key, step, wall_time), live points only."""
    per_point, per_step = [], {}
    for t, _key, step, wall in pairs:
        if wall < since or step <= skip_steps:
            continue
        per_point.append(t - wall)
        per_step.setdefault(step, t - wall)
    return per_point, list(per_step.values())


def measure(dep: Deployment, steps: int) -> dict[str, Any]:
    api = dep.api
    exp = api.post("/api/experiments", {"project": dep.info["project"], "name": "follow",
                                        "config": tiny_config(dep, steps)})  # fmt: skip
    run_id = api.post("/api/runs", {"experiment": exp["id"]})["id"]
    deadline = time.monotonic() + 300
    while api.get(f"/api/runs/{run_id}")["state"] != "running" and time.monotonic() < deadline:
        time.sleep(0.5)
    host = PUBLIC_HOST if dep.kind == "redis" else ""
    browser = Follower(dep.stack.url, run_id, dep.cookie, host=host, origin=f"https://{host}" if host else "")
    cli = CliFollower(dep.stack.url, dep.info["token"], run_id)
    code = cli.wait(timeout_s=900)
    time.sleep(1.0)
    cli_points = [(t, d["key"], d["step"], d["wall_time"]) for t, d in cli.lines if d["type"] == "metric"]
    browser_points = [
        (t, key, step, wall)
        for t, m in list(browser.messages)
        if m.get("kind") == "metrics"
        for key, s in m["series"].items()
        for step, wall in zip(s["steps"], s["wall_times"], strict=True)
    ]
    cli_point, cli_step = latencies(cli_points, cli.started)
    browser_point, browser_step = latencies(browser_points, cli.started)
    end = cli.lines[-1][1] if cli.lines else {}
    stored = api.get(f"/api/runs/{run_id}/metrics/export/json")["points"]
    followed = {(k, s) for _, k, s, _ in cli_points}
    return {
        "cli_exit": code,
        "cli_stderr": (cli.proc.stderr.read() if cli.proc.stderr else "")[-500:] if code else "",
        "final_state": end.get("state"),
        "cli_points_equal_database": followed == {(p["key"], p["step"]) for p in stored}
        and len(followed) == len(cli_points),
        "terminal_per_point": summary(cli_point),
        "terminal_per_step": summary(cli_step),
        "browser_per_point": summary(browser_point),
        "browser_per_step": summary(browser_step),
    }


def measure_posted(dep: Deployment, batches: int, per_batch: int = 10) -> dict[str, Any]:
    """``--source post``: the platform's part alone, no engine (no Ray head). Batches of points are posted
    through the REST API to a running run every 100 ms, ``wall_time`` = the moment each is sent; both
    clients follow that run. POST → terminal beside POST → browser."""
    api, run_id = dep.api, dep.info["runs"][0]
    host = PUBLIC_HOST if dep.kind == "redis" else ""
    browser = Follower(dep.stack.url, run_id, dep.cookie, host=host, origin=f"https://{host}" if host else "")
    cli = CliFollower(dep.stack.url, dep.info["token"], run_id)
    api.post(f"/api/runs/{run_id}/metrics", {"points": [{"key": "warmup", "step": 0, "value": 0.0,
                                                         "wall_time": time.time()}]})  # fmt: skip
    deadline = time.monotonic() + 120
    while not cli.lines and time.monotonic() < deadline:  # the CLI is connected and caught up
        time.sleep(0.1)
    started = time.time()
    for i in range(1, batches + 1):
        sent = time.time()
        api.post(f"/api/runs/{run_id}/metrics", {"points": [
            {"key": f"probe/{k}", "step": i, "value": float(k), "wall_time": sent} for k in range(per_batch)]})  # fmt: skip
        time.sleep(max(0.0, sent + 0.1 - time.time()))
    time.sleep(3.0)
    cli.proc.terminate()
    cli.wait(timeout_s=30)
    cli_points = [(t, d["key"], d["step"], d["wall_time"]) for t, d in cli.lines if d.get("type") == "metric"]
    browser_points = [(t, key, step, wall) for t, m in list(browser.messages) if m.get("kind") == "metrics"
                      for key, s in m["series"].items()
                      for step, wall in zip(s["steps"], s["wall_times"], strict=True)]  # fmt: skip
    probe = [p for p in cli_points if p[1].startswith("probe/")]
    cli_point, cli_step = latencies(probe, started, skip_steps=0)
    browser_point, browser_step = latencies([p for p in browser_points if p[1].startswith("probe/")], started,
                                            skip_steps=0)  # fmt: skip
    return {
        "source": "post",
        "cli_points_received": len(probe),
        "cli_points_sent": batches * per_batch,
        "terminal_per_point": summary(cli_point),
        "terminal_per_step": summary(cli_step),
        "browser_per_point": summary(browser_point),
        "browser_per_step": summary(browser_step),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deployments", default="embedded")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--source", choices=["engine", "post"], default="engine",
                   help="engine: a demo run trains; post: batches posted through the API (no Ray)")  # fmt: skip
    p.add_argument("--batches", type=int, default=150, help="--source post: 10 points each, every 100 ms")
    p.add_argument("--smoke", action="store_true", help=f"embedded, {SKIP_STEPS + 2} steps (or 5 batches)")
    args = p.parse_args()
    if args.smoke:  # the code paths of the full run at tiny sizes (run_all.py --smoke): figures mean nothing
        args.deployments, args.steps, args.batches = "embedded", SKIP_STEPS + 2, 5
    results = []
    for kind in args.deployments.split(","):
        load_before = os.getloadavg()[0]
        dep = Deployment(kind, flush_s=0.05)
        if kind == "redis":  # the CLI on loopback, plain HTTP (see the docstring)
            dep.stack.env |= {
                "DJANGO_ALLOWED_HOSTS": f"{PUBLIC_HOST},127.0.0.1",
                "DJANGO_SECURE_SSL_REDIRECT": "0",
            }
        try:
            dep.start()
            result = (
                measure(dep, args.steps) if args.source == "engine" else measure_posted(dep, args.batches)
            )
        finally:
            dep.close()
        result |= {"deployment": kind, "steps": args.steps, "load_before": round(load_before, 1),
                   "load_after": round(os.getloadavg()[0], 1)}  # fmt: skip
        print(json.dumps(result), flush=True)
        results.append(result)
    src = "engine" if args.source == "engine" else "POST"
    print(f"\n| deployment | {src} → terminal (rlp) p50 / p95 / max (points; steps p95) | {src} → browser p50 / p95 "
          "/ max (points; steps p95) | load |\n|---|---|---|---|")  # fmt: skip
    for r in results:
        t, ts, b, bs = (
            r["terminal_per_point"],
            r["terminal_per_step"],
            r["browser_per_point"],
            r["browser_per_step"],
        )
        print(f"| {r['deployment']} | {t.get('p50_ms')} / {t.get('p95_ms')} / {t.get('max_ms')} ms ({t['n']}; "
              f"{ts.get('p95_ms')} ms over {ts['n']}) | {b.get('p50_ms')} / {b.get('p95_ms')} / {b.get('max_ms')} ms "
              f"({b['n']}; {bs.get('p95_ms')} ms over {bs['n']}) | {r['load_before']}-{r['load_after']} |")  # fmt: skip


if __name__ == "__main__":
    main()

"""A sweep on the real stack: 6 tiny demo runs at concurrency 2 against one run alone (issue 22).

    .venv/bin/python benchmarks/sweep_concurrency.py              # 6 runs, at most 2 at once, 20 steps each
    .venv/bin/python benchmarks/sweep_concurrency.py --runs 6 --concurrent 2 --steps 20
    .venv/bin/python benchmarks/sweep_concurrency.py --smoke     # 2 runs of 2 steps: a check that it runs

The embedded default in a scratch VAR_DIR (its own SQLite database, broker folders and local Ray head,
all removed at the end): the web server, one ``celery worker -B`` (threads pool) and the platform's
local Ray head, as benchmarks/launcher_latency.py starts them, with a global limit of 4 runs (so the
sweep's own cap is what binds). A first run starts the Ray head and is not counted. Then one run alone
(API call → ``succeeded``), then a grid sweep of ``--runs`` values of ``trainer.lr`` with
``max_concurrent`` ``--concurrent`` (API call → every run finished). While the sweep runs, the script
samples every 0.25 s how many of its runs are busy (starting/running/cancelling) and times
``GET /api/sweeps/{id}`` (what the sweep page polls), to show that the page stays live.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform"), str(ROOT / "benchmarks")]

from launcher_latency import Stack, api_post, tiny_config, wait  # noqa: E402

TERMINAL = ("succeeded", "failed", "cancelled")
BUSY = ("starting", "running", "cancelling")


def api_get(stack: Stack, token: str, path: str) -> tuple[dict, float]:
    req = Request(f"http://127.0.0.1:{stack.port}{path}", headers={"Authorization": f"Token {token}"})
    t0 = time.monotonic()
    with urlopen(req, timeout=30) as resp:
        body = json.loads(resp.read())
    return body, time.monotonic() - t0


def one_run(stack: Stack, token: str, experiment_id: int) -> tuple[float, float]:
    """(API call → succeeded, running → finished) of one run alone."""
    from experiments.models import Run

    t0 = time.monotonic()
    run_id = api_post(stack, token, "/api/runs", {"experiment": experiment_id})["id"]
    t1 = wait(lambda: Run.objects.filter(pk=run_id, state__in=TERMINAL).exists(), 600, "the run's end", 0.1)
    run = Run.objects.get(pk=run_id)
    if run.state != "succeeded":
        raise SystemExit(f"error: run {run_id} ended {run.state}: {run.error}")
    return t1 - t0, (run.finished_at - run.started_at).total_seconds()


def sweep(stack: Stack, token: str, experiment_id: int, runs: int, concurrent: int) -> dict[str, Any]:
    from experiments.models import Run

    lrs = [round(1e-6 * (k + 1), 12) for k in range(runs)]
    body = {"experiment": experiment_id, "method": "grid", "search_space": {"trainer.lr": lrs},
            "max_concurrent": concurrent, "metric": "reward/mean", "seed": 0}  # fmt: skip
    t0 = time.monotonic()
    sweep_id = api_post(stack, token, "/api/sweeps", body)["id"]
    ids = list(Run.objects.filter(sweep_member__sweep_id=sweep_id).values_list("pk", flat=True))
    max_busy, page_s, deadline = 0, [], time.monotonic() + 1200
    while time.monotonic() < deadline:
        states = list(Run.objects.filter(pk__in=ids).values_list("state", flat=True))
        max_busy = max(max_busy, sum(s in BUSY for s in states))
        answer, took = api_get(stack, token, f"/api/sweeps/{sweep_id}")
        page_s.append(took)
        if all(s in TERMINAL for s in states):
            break
        time.sleep(0.25)
    else:
        raise SystemExit("error: the sweep did not finish within 20 minutes")
    total = time.monotonic() - t0
    final = dict(Run.objects.filter(pk__in=ids).values_list("pk", "state"))
    spans = [
        (f - s).total_seconds()
        for s, f in Run.objects.filter(pk__in=ids).values_list("started_at", "finished_at")
    ]
    return {
        "sweep_s": total,
        "sweep_run_running_s_mean": statistics.mean(spans),  # each run's running → finished, in parallel
        "max_busy": max_busy,
        "run_states": sorted(final.values()),
        "ranked": [r["value"] for r in answer["runs"]],
        "page_polls": len(page_s),
        "page_median_ms": statistics.median(page_s) * 1000,
        "page_max_ms": max(page_s) * 1000,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--concurrent", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="trainer.total_steps of each run")
    p.add_argument("--smoke", action="store_true", help="a sweep of 2 runs at once, 2 steps each")
    args = p.parse_args()
    if args.smoke:  # the code paths of the full run at tiny sizes (run_all.py --smoke): figures mean nothing
        args.runs, args.concurrent, args.steps = 2, 2, 2
    var_dir = Path(tempfile.mkdtemp(prefix="rlp-bench-", dir="/tmp"))
    stack = Stack(var_dir, sweep_interval=3)
    stack.attach()
    from django.contrib.auth import get_user_model

    from accounts.services import project_create, token_create
    from experiments.services import experiment_create
    from launcher import ray_local

    user = get_user_model().objects.create_user("bench", password="bench-password")
    project = project_create(name="bench", user=user)
    token = token_create(user=user, name="bench").secret
    exp = experiment_create(project=project, user=user, name="sweep", config=tiny_config(args.steps))
    results: dict[str, Any] = {"runs": args.runs, "concurrent": args.concurrent, "steps": args.steps}
    try:
        stack.start_web()
        stack.start_worker()
        results["cold_run_s"] = one_run(stack, token, exp.pk)[0]  # starts the Ray head: not counted
        results["one_run_s"], results["one_run_running_s"] = one_run(stack, token, exp.pk)
        results.update(sweep(stack, token, exp.pk, args.runs, args.concurrent))
        waves = -(-args.runs // args.concurrent)
        results["sweep_over_one_run"] = results["sweep_s"] / results["one_run_s"]
        results["ideal_ratio"] = waves
    finally:
        stack.stop()
        ray_local.stop()
        shutil.rmtree(var_dir, ignore_errors=True)
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in results.items()}, indent=2))


if __name__ == "__main__":
    main()

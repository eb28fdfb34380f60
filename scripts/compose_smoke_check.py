"""The client half of scripts/compose_smoke.sh, run in a one-off container of the platform image on the
compose network (``compose run --rm --no-deps web python scripts/compose_smoke_check.py``).

It creates a user (with a project and an API token) in the stack's database, logs in through the login
page like a browser, launches a ``demo-cpu`` run through the REST API as a client behind the TLS proxy,
and follows it over the run websocket. Once the run has stored ``--restart-after`` steps it prints
``RESTART-WEB`` and waits: the shell restarts the web container, the socket closes, and the checker
connects again and reloads the stored history over REST, as the run page does. When
the run has ``succeeded`` it checks, against the engine's own JSONL log on the shared volume:

- every point the engine logged is stored, once (restart included: the engine's sink spools while the
  web server is away);
- every stored point reached the client (websocket, or the REST history a reconnect reloads).

Exit status 0 and a ``RESULT {...}`` JSON line on success; a one-line ``error:`` and status 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import sys
import time
import urllib.error
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.platform_stack import Api, Follower, wait_until

Point = tuple[str, int, float]


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def create_user() -> tuple[str, str, str, int]:
    """A fresh user with a project and a token: (username, password, token, project id)."""
    from django.contrib.auth import get_user_model

    from accounts.services import project_create, token_create

    username, password = f"smoke-{secrets.token_hex(4)}", secrets.token_urlsafe(16)
    user = get_user_model().objects.create_user(username, password=password)
    token = token_create(user=user, name="compose smoke").secret
    return username, password, token, project_create(name=username, user=user).pk


def stored_points(run_id: int) -> list[Point]:
    from tracking.models import MetricPoint

    rows = MetricPoint.objects.filter(run_id=run_id).values_list("key", "step", "value")
    return [(k, int(s), float(v)) for k, s, v in rows]


def logged_points(run_id: int) -> list[Point]:
    """Every finite (key, step, value) the engine wrote to its JSONL log (NaN/inf are never sent)."""
    from experiments.models import Run
    from experiments.run_files import jsonl_log

    run = Run.objects.get(pk=run_id)
    out: list[Point] = []
    for line in jsonl_log(run).read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "metrics":
            out += [
                (k, int(rec["step"]), float(v)) for k, v in rec["metrics"].items() if math.isfinite(float(v))
            ]
    return out


def history(api: Api, run_id: int) -> set[Point]:
    """The stored series as the run page loads them over REST (no downsampling)."""
    reply = api.get(f"/api/runs/{run_id}/metrics?max_points=100000")
    return {
        (s["key"], int(st), float(v))
        for s in reply["series"]
        for st, v in zip(s["steps"], s["values"], strict=True)
    }


def steps(points: list[Point] | set[Point]) -> int:
    return len({s for _, s, _ in points})


def reconnect(base: str, run_id: int, cookie: str, host: str, timeout_s: float) -> Follower:
    """Connects again once the web server answers (it is restarting); the catch-up sends every event."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Follower(base, run_id, cookie, host=host, origin=f"https://{host}")
        except (RuntimeError, OSError, urllib.error.URLError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the websocket did not come back within {timeout_s:.0f} s: {exc}"
                ) from exc
            time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="http://web:8000")
    parser.add_argument("--steps", type=int, default=1000, help="the demo-cpu run's total_steps")
    parser.add_argument(
        "--restart-after", type=int, default=5, help="steps stored before the web restart (0: none)"
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds for the whole run")
    args = parser.parse_args()
    setup_django()
    from django.conf import settings

    host = next(h for h in settings.ALLOWED_HOSTS if h not in ("localhost", "web", "*"))
    t0 = time.monotonic()
    stamp = lambda: f"{time.monotonic() - t0:.1f} s"  # noqa: E731

    username, password, token, project = create_user()
    api = Api(args.base, token, host=host, https_proxy=True)
    cookie = api.login(username, password)
    config = api.get("/api/presets/demo-cpu")
    config["trainer"]["total_steps"] = args.steps
    # Every step logged, to the platform and to a JSONL file in the run's folder: the engine's own record.
    config["logging"] = {"sinks": ["stdout", "jsonl"], "log_every": 1}
    exp = api.post("/api/experiments", {"project": project, "name": "compose smoke", "config": config})
    run_id = api.post("/api/runs", {"experiment": exp["id"]})["id"]
    print(f"[check {stamp()}] user {username}, run {run_id} launched ({args.steps} steps)", flush=True)

    ws = Follower(args.base, run_id, cookie, host=host, origin=f"https://{host}")
    seen: set[Point] = set()
    restarted = 0
    if args.restart_after:
        ws.wait_for(
            lambda f: steps(f.points()) >= args.restart_after, args.timeout, "steps over the websocket"
        )
        if "succeeded" in ws.states():
            raise RuntimeError("the run ended before the web restart: raise --steps")
        print(f"[check {stamp()}] {steps(ws.points())} steps over the websocket; RESTART-WEB", flush=True)
        wait_until(lambda: ws.closed, 120, "the websocket to close (web restarting)", 0.1)
        seen |= set(ws.points())
        ws = reconnect(args.base, run_id, cookie, host, 180)
        seen |= history(api, run_id)
        restarted = 1
        state = ws.wait_for(lambda f: f.of_kind("hello"), 30, "the hello message")[0]["run"]["state"]
        if state != "running":
            raise RuntimeError(
                f"the run was {state} when the web server was back, not mid-run: raise --steps"
            )
        print(f"[check {stamp()}] reconnected after the restart, the run still running ({steps(seen)} steps known)",
              flush=True)  # fmt: skip
    ws.wait_for(lambda f: "succeeded" in f.states() or {"failed", "cancelled"} & set(f.states()),
                args.timeout, "the run's end over the websocket")  # fmt: skip
    state = api.get(f"/api/runs/{run_id}")["state"]
    if state != "succeeded":
        raise RuntimeError(f"run {run_id} ended {state}: {api.get(f'/api/runs/{run_id}').get('error')}")
    print(f"[check {stamp()}] run {run_id} succeeded", flush=True)

    stored, logged = stored_points(run_id), logged_points(run_id)
    if sorted(stored) != sorted(logged):
        raise RuntimeError(
            f"stored points differ from the engine's log: {len(stored)} stored, {len(logged)} logged, "
            f"missing {sorted(set(logged) - set(stored))[:5]}, extra {sorted(set(stored) - set(logged))[:5]}"
        )
    # Points stored after the last live message reach the socket through the poll: wait for them.
    wait_until(
        lambda: seen | set(ws.points()) >= set(stored), 30, "every stored point over the websocket", 0.2
    )
    seen |= set(ws.points())
    if seen != set(stored):
        raise RuntimeError(f"the client saw {len(seen)} points, {len(set(stored))} are stored")
    ws.close()
    result = {"run": run_id, "steps": steps(stored), "points": len(stored), "web_restarts": restarted,
              "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)

"""Webhooks: a receiver that is down for 30 s gets every alert afterwards, once each.

    .venv/bin/python benchmarks/webhook_outage.py                        # refused connections, 100 alerts
    .venv/bin/python benchmarks/webhook_outage.py --down-mode 503        # it answers 503 while down
    .venv/bin/python benchmarks/webhook_outage.py --kill-worker          # and the worker dies (kill -9)
    .venv/bin/python benchmarks/webhook_outage.py --smoke                # 3 alerts, a 2 s outage: a check

The real stack as the production pass runs it: PostgreSQL (a scratch database ``rlp_bench_webhooks``,
dropped and re-created), Redis as the broker (its own queue name), one ``celery worker -B`` (threads pool,
embedded beat) with the platform's default retry settings unless told otherwise. A local HTTP receiver on
127.0.0.1 (allowed by WEBHOOK_ALLOWED_HOSTS) is down for ``--outage`` seconds — nothing listens on its
port (``refuse``) or it answers 503 (``503``) — while ``--alerts`` alerts open (one per run, evenly over
the first 90 % of the outage, each raised in this process as the platform raises them: its delivery is
enqueued when the alert commits); then it comes up and answers 200. ``--kill-worker``: halfway through the
outage the worker is killed with SIGKILL (the countdown messages of the retries it holds are lost to the
others for Redis' visibility timeout, an hour) and a new one started: only the beat sweep
(``alerts.resend_due_deliveries``) can deliver those.

Counted by the receiver, per idempotency key (``X-RLP-Delivery``): alerts received (each must be, once),
requests beyond the first per key, signatures that verify; from the receiver coming up: the time to the
first arrival of each key (median and last); from the database: attempts per delivery. After the last
delivery it keeps listening ``--settle`` seconds (more than a sweep interval) for late duplicates.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
SECRET = "bench-webhook-secret-0123456789abcdef"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rlp_bench_webhooks"),
    )
    p.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7"))
    p.add_argument("--alerts", type=int, default=100)
    p.add_argument("--outage", type=float, default=30.0, help="seconds the receiver is down")
    p.add_argument("--down-mode", choices=["refuse", "503"], default="refuse")
    p.add_argument("--kill-worker", action="store_true", help="kill -9 the worker halfway through the outage")
    p.add_argument(
        "--retry-base", type=float, default=10.0, help="WEBHOOK_RETRY_BASE_S (default: the platform's)"
    )
    p.add_argument(
        "--retry-max", type=float, default=600.0, help="WEBHOOK_RETRY_MAX_S (default: the platform's)"
    )
    p.add_argument("--sweep-interval", type=float, default=30.0, help="WEBHOOK_SWEEP_INTERVAL_S")
    p.add_argument("--concurrency", type=int, default=8, help="the worker's threads")
    p.add_argument("--settle", type=float, default=0.0, help="listen this long after the last delivery "
                   "for duplicates (default: the sweep interval + 5 s)")  # fmt: skip
    p.add_argument("--smoke", action="store_true", help="3 alerts, a 2 s outage, short retries (seconds)")
    args = p.parse_args()
    if args.smoke:  # the code paths of the full run at tiny sizes (run_all.py --smoke): figures mean nothing
        args.alerts, args.outage, args.retry_base, args.retry_max = 3, 2.0, 0.5, 2.0
        args.sweep_interval, args.concurrency, args.settle = 2.0, 2, 1.0
    return args


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Receiver:
    """Records (delivery id, monotonic time, signature ok) of each request once ``up``; before that it is
    not listening (``refuse``) or answers 503 without recording (``503``)."""

    def __init__(self, port: int, mode: str):
        self.port, self.mode = port, mode
        self.up = False
        self.got: list[tuple[str, float, bool]] = []
        self.refused_503 = 0
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    def _serve(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not receiver.up:
                    with receiver.lock:
                        receiver.refused_503 += 1
                    self.send_response(503)
                else:
                    ts, sig = self.headers.get("X-RLP-Timestamp", ""), self.headers.get("X-RLP-Signature", "")
                    mac = hmac.new(SECRET.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
                    ok = hmac.compare_digest(sig, "sha256=" + mac)
                    key = self.headers.get("X-RLP-Delivery", "")
                    with receiver.lock:
                        receiver.got.append(
                            (key, time.monotonic(), ok and json.loads(body)["delivery_id"] == key)
                        )
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def start_down(self) -> None:
        if self.mode == "503":
            self._serve()

    def come_up(self) -> float:
        self.up = True
        if self.server is None:
            self._serve()
        return time.monotonic()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def setup_django(database_url: str, redis_url: str, env: dict[str, str]) -> None:
    """A fresh scratch database (dropped and re-created), migrated; this process on the same broker."""
    import psycopg

    from config.env import parse_database_url

    db = parse_database_url(database_url).as_django()
    if "bench" not in db["NAME"]:
        raise SystemExit(f"error: refusing to drop database {db['NAME']!r}: its name must contain 'bench'")
    admin = f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} user={db['USER']} dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db["NAME"]}"')
        conn.execute(f'CREATE DATABASE "{db["NAME"]}"')
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


class Worker:
    def __init__(self, env: dict[str, str], var_dir: Path, concurrency: int):
        self.env, self.var_dir, self.concurrency = env, var_dir, concurrency
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = var_dir / "worker.log"

    def start(self) -> None:
        seen = self.log.read_text(errors="replace").count(" ready.") if self.log.exists() else 0
        out = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "-B", "-l", "INFO", "--pool=threads",
             f"--concurrency={self.concurrency}", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-s", str(self.var_dir / f"beat-{time.time_ns()}")],
            cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while self.log.read_text(errors="replace").count(" ready.") <= seen:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(
                    "error: the worker did not start:\n" + self.log.read_text(errors="replace")[-3000:]
                )
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def make_runs(n: int) -> tuple[object, list]:
    """Run rows to raise alerts on, created directly (run_create would hand them to the launcher)."""
    from django.contrib.auth import get_user_model

    from accounts.services import project_create
    from experiments.config_policy import platform_preset
    from experiments.models import Run
    from experiments.services import experiment_create

    user = get_user_model().objects.create_user("bench", password="bench-password")
    project = project_create(name="bench", user=user)
    exp = experiment_create(project=project, user=user, name="bench", config=platform_preset("demo-cpu"))
    runs = [
        Run.objects.create(experiment=exp, project=project, number=i + 1, config=exp.config, state="running")
        for i in range(n)
    ]
    return project, runs


def main() -> None:
    args = parse_args()
    settle = args.settle or args.sweep_interval + 5
    var_dir = Path(tempfile.mkdtemp(prefix="rlp-bench-webhooks-", dir="/tmp"))
    queue = f"bench-webhooks-{os.getpid()}"
    env = {
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "CELERY_QUEUE": queue,
        "CELERY_LAUNCHER_QUEUE": queue,
        "VAR_DIR": str(var_dir),
        "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
        "WEBHOOK_RETRY_BASE_S": str(args.retry_base),
        "WEBHOOK_RETRY_MAX_S": str(args.retry_max),
        "WEBHOOK_SWEEP_INTERVAL_S": str(args.sweep_interval),
        "ALERT_RULES_INTERVAL_S": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    worker_env = {**os.environ, **env, "PYTHONPATH": f"{ROOT / 'platform'}:{ROOT}"}
    worker_env.pop("DJANGO_SETTINGS_MODULE", None)
    setup_django(args.database_url, args.redis_url, env)

    from django.conf import settings

    from alerts.models import AlertKind, DeliveryStatus, Webhook, WebhookDelivery
    from alerts.services import alert_raise

    project, runs = make_runs(args.alerts)
    receiver = Receiver(free_port(), args.down_mode)
    Webhook.objects.create(project=project, url=f"http://127.0.0.1:{receiver.port}/hook", secret=SECRET)
    worker = Worker(worker_env, var_dir, args.concurrency)
    killed_at: float | None = None
    restart: threading.Thread | None = None
    try:
        worker.start()
        receiver.start_down()
        t0 = time.monotonic()
        spacing = args.outage * 0.9 / max(1, args.alerts)
        for i, run in enumerate(runs):  # evenly over the first 90 % of the outage
            time.sleep(max(0.0, t0 + i * spacing - time.monotonic()))
            alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message=f"bench alert {i}")
            if args.kill_worker and killed_at is None and time.monotonic() - t0 >= args.outage / 2:
                worker.kill()
                killed_at = time.monotonic() - t0
                restart = threading.Thread(target=worker.start)  # alerts keep opening meanwhile
                restart.start()
        time.sleep(max(0.0, t0 + args.outage - time.monotonic()))
        t_up = receiver.come_up()
        if restart is not None:
            restart.join()
        finished = [DeliveryStatus.SUCCEEDED, DeliveryStatus.FAILED, DeliveryStatus.REFUSED]
        limit = args.outage + 2 * args.retry_max + 2 * args.sweep_interval + 120
        while WebhookDelivery.objects.exclude(status__in=finished).exists():
            if time.monotonic() - t_up > limit:
                tail = worker.log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"error: deliveries still open after {limit:.0f} s:\n{tail}")
            time.sleep(0.2)
        t_done = time.monotonic()
        time.sleep(settle)  # late duplicates (a stray copy of an attempt, a sweep) would arrive now
    finally:
        worker.kill()
        receiver.stop()

    per_key = collections.Counter(key for key, _, _ in receiver.got)
    first_at: dict[str, float] = {}
    for key, at, _ in receiver.got:
        first_at.setdefault(key, at)
    rows = list(WebhookDelivery.objects.values_list("delivery_id", "status", "attempts"))
    expected = {str(d) for d, _, _ in rows}
    attempts = [a for _, _, a in rows]
    catch_up = sorted(at - t_up for at in first_at.values())
    result = {
        "alerts": args.alerts,
        "outage_s": args.outage,
        "down_mode": args.down_mode,
        "worker_killed_at_s": None if killed_at is None else round(killed_at, 1),
        "retry_base_s": settings.WEBHOOK_RETRY_BASE_S,
        "retry_max_s": settings.WEBHOOK_RETRY_MAX_S,
        "sweep_interval_s": settings.WEBHOOK_SWEEP_INTERVAL_S,
        "deliveries": len(rows),
        "succeeded": sum(1 for _, s, _ in rows if s == DeliveryStatus.SUCCEEDED),
        "received_keys": len(per_key),
        "every_alert_received": set(per_key) == expected and len(expected) == args.alerts,
        "requests_after_up": len(receiver.got),
        "duplicates": len(receiver.got) - len(per_key),
        "max_per_key": max(per_key.values(), default=0),
        "signatures_ok": sum(1 for _, _, ok in receiver.got if ok),
        "answered_503_while_down": receiver.refused_503,
        "catch_up_median_s": round(statistics.median(catch_up), 2) if catch_up else None,
        "catch_up_last_s": round(catch_up[-1], 2) if catch_up else None,
        "all_finished_after_up_s": round(t_done - t_up, 2),
        "attempts_min_median_max": [min(attempts), statistics.median(attempts), max(attempts)],
        "attempts_histogram": dict(sorted(collections.Counter(attempts).items())),
        "settle_s": settle,
    }
    shutil.rmtree(var_dir, ignore_errors=True)
    print(json.dumps(result, indent=2))
    if not result["every_alert_received"] or result["duplicates"]:
        raise SystemExit("error: not every alert was received exactly once")


if __name__ == "__main__":
    main()

"""Platform benchmark: metric ingestion into PostgreSQL over HTTP, and downsampled chart queries.

    .venv/bin/python benchmarks/ingest.py                       # defaults below
    .venv/bin/python benchmarks/ingest.py --clients 4 --batches 25 --servers 2 --series 1000000
    .venv/bin/python benchmarks/ingest.py --quick    # small (``make bench``)
    .venv/bin/python benchmarks/ingest.py --smoke    # one batch, a 5,000-point series: a check that it runs

Needs PostgreSQL (``--database-url``, default a scratch database ``rlp_bench`` that it creates and
migrates). What it measures, in one invocation so that machine load hits every contender alike:

1. Ingestion: ``--servers`` daphne processes (the production server) share one listening socket;
   ``--clients`` processes each post ``--batches`` batches of 5000 points to their own run with that
   run's ingest token, all at once. Sustained points/s = points stored / wall time from the first
   request to the last answer. Then every batch is posted again: the retries must insert 0 rows.
2. Baseline for (1): the same points through per-point ORM inserts (what a naive endpoint does), and
   through the service in-process (no HTTP), on one 5000-point batch, points/s.
3. Query: a 1,000,000-point series downsampled to 2,000 points, server time (the selector in-process,
   median of ``--repeats``) and over HTTP; baselines in the same run: fetching every point undownsampled,
   the portable scan path (what SQLite does) and a GROUP BY over the raw points without rollups.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
BATCH = 5000


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rlp_bench"),
    )
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--batches", type=int, default=25, help="batches of 5000 points per client")
    p.add_argument("--servers", type=int, default=2, help="daphne processes")
    p.add_argument("--series", type=int, default=1_000_000, help="points in the downsampled series")
    p.add_argument("--max-points", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="1 client, 2 batches, 1 server, 20,000-point series")
    p.add_argument("--smoke", action="store_true", help="1 client, 1 batch, 1 server, 5,000-point series")
    args = p.parse_args()
    if args.quick:  # a smoke run (make bench): the figures are not the recorded ones
        args.clients, args.batches, args.servers, args.series, args.repeats = 1, 2, 1, 20_000, 1
    if args.smoke:  # the code paths of the full run at tiny sizes (run_all.py --smoke): figures mean nothing
        args.clients, args.batches, args.servers, args.series, args.repeats = 1, 1, 1, 5_000, 1
    return args


def setup_django(database_url: str) -> None:
    """Point Django at a fresh scratch database (dropped and re-created) and migrate it."""
    import psycopg

    from config.env import parse_database_url

    db = parse_database_url(database_url).as_django()
    if "bench" not in db["NAME"]:
        raise SystemExit(f"error: refusing to drop database {db['NAME']!r}: its name must contain 'bench'")
    admin = f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} user={db['USER']} dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db["NAME"]}"')
        conn.execute(f'CREATE DATABASE "{db["NAME"]}"')
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def make_runs(n: int) -> list:
    """Run rows to report into. Created directly, not through run_create: that would hand them to the
    launcher (a Celery task that starts Ray jobs), which has no place in this measurement."""
    from django.contrib.auth import get_user_model

    from accounts.services import project_create
    from experiments.config_policy import platform_preset
    from experiments.models import Experiment, Run
    from experiments.services import experiment_create

    exp = Experiment.objects.filter(name="bench").first()
    if exp is None:
        user = get_user_model().objects.create_user("bench", password="bench-password")
        project = project_create(name="bench", user=user)
        exp = experiment_create(project=project, user=user, name="bench", config=platform_preset("demo-cpu"))
    first = Run.objects.filter(experiment=exp).count() + 1
    return [
        Run.objects.create(
            experiment=exp, project_id=exp.project_id, number=first + i, config=exp.config, state="running"
        )
        for i in range(n)
    ]


def batch_body(client: int, i: int) -> bytes:
    """5000 points: 10 keys x 500 steps, as the engine's sink would send them."""
    base = i * 500
    points = [
        {
            "key": f"metric/{k}",
            "step": base + s,
            "value": (client * 7 + k * 3 + s) % 97 / 9.7,
            "wall_time": 1.7e9 + base + s,
        }
        for s in range(500)
        for k in range(10)
    ]
    return json.dumps({"points": points}).encode()


def start_servers(n: int, env: dict[str, str]) -> tuple[list[subprocess.Popen], int]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    port = sock.getsockname()[1]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "--fd",
                str(sock.fileno()),
                "-v",
                "0",
                "config.asgi:application",
            ],
            env=env,
            cwd=ROOT,
            pass_fds=[sock.fileno()],
        )
        for _ in range(n)
    ]
    sock.close()
    import requests

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/api/health/", timeout=2).status_code == 200:
                return procs, port
        except requests.RequestException:
            time.sleep(0.3)
    raise SystemExit("error: the daphne servers did not answer within 60 s")


def client_main(args: tuple) -> tuple[list[float], list[int], float, float]:
    """One client process: post every batch, return latencies, inserted counts, first start, last end."""
    import requests

    port, run_id, secret, client, batches, barrier = args
    bodies = [batch_body(client, i) for i in range(batches)]  # encoded before the clock starts
    session = requests.Session()
    headers = {"Authorization": f"Token {secret}", "Content-Type": "application/json"}
    url = f"http://127.0.0.1:{port}/api/runs/{run_id}/metrics"
    barrier.wait()
    start = time.time()
    latencies, inserted = [], []
    for body in bodies:
        t = time.perf_counter()
        resp = session.post(url, data=body, headers=headers, timeout=120)
        latencies.append(time.perf_counter() - t)
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        inserted.append(resp.json()["inserted"])
    return latencies, inserted, start, time.time()


def run_clients(port: int, runs: list, secrets: list[str], batches: int) -> tuple[float, list[float], int]:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(len(runs))
        with ctx.Pool(len(runs)) as pool:
            results = pool.map(
                client_main,
                [
                    (port, r.pk, s, i, batches, barrier)
                    for i, (r, s) in enumerate(zip(runs, secrets, strict=True))
                ],
            )
    wall = max(r[3] for r in results) - min(r[2] for r in results)
    return wall, [lat for r in results for lat in r[0]], sum(sum(r[1]) for r in results)


def bench_ingest(args: argparse.Namespace) -> dict:
    from datetime import timedelta

    from django.utils import timezone

    from accounts.services import ingest_token_issue
    from tracking.models import MetricPoint

    runs = make_runs(args.clients)
    # No heartbeats here to renew them: tokens that outlive the whole benchmark.
    until = timezone.now() + timedelta(hours=6)
    secrets = [ingest_token_issue(run=r, expires_at=until).secret for r in runs]
    env = {
        **os.environ,
        "DATABASE_URL": args.database_url,
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": "benchmark-only-secret-key-benchmark-only",
        "DJANGO_SECURE_SSL_REDIRECT": "0",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "platform"), str(ROOT)]),
        "LOG_LEVEL": "WARNING",
    }
    procs, port = start_servers(args.servers, env)
    try:
        wall, lat, inserted = run_clients(port, runs, secrets, args.batches)
        stored = MetricPoint.objects.filter(run__in=runs).count()
        retry_wall, _, retry_inserted = run_clients(port, runs, secrets, args.batches)
        after_retry = MetricPoint.objects.filter(run__in=runs).count()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    total = args.clients * args.batches * BATCH
    assert inserted == stored == total, (inserted, stored, total)
    assert retry_inserted == 0 and after_retry == stored, "a retried batch added rows"
    lat.sort()
    return {
        "points": total,
        "wall_s": wall,
        "points_per_s": total / wall,
        "p50_ms": lat[len(lat) // 2] * 1e3,
        "p95_ms": lat[int(len(lat) * 0.95)] * 1e3,
        "retry_points_per_s": total / retry_wall,
        "retry_inserted": retry_inserted,
    }


def bench_ingest_baselines() -> dict:
    from django.db import transaction

    from tracking.models import MetricPoint
    from tracking.services import Point, metrics_ingest

    run_service, run_naive = make_runs(2)
    pts = [
        Point(p["key"], p["step"], p["value"], p["wall_time"]) for p in json.loads(batch_body(0, 0))["points"]
    ]
    t = time.perf_counter()
    metrics_ingest(run_id=run_service.pk, points=pts)
    service = time.perf_counter() - t
    t = time.perf_counter()
    with transaction.atomic():  # the naive endpoint: one INSERT per point (in one transaction, to be fair)
        for p in pts:
            MetricPoint.objects.get_or_create(
                run_id=run_naive.pk,
                key=p.key,
                step=p.step,
                defaults={"value": p.value, "wall_time": p.wall_time},
            )
    naive = time.perf_counter() - t
    return {"service_points_per_s": len(pts) / service, "naive_points_per_s": len(pts) / naive}


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench_query(args: argparse.Namespace) -> dict:
    import math

    from django.db import connection

    from tracking import selectors
    from tracking.models import MetricPoint
    from tracking.services import Point, metrics_ingest

    [run] = make_runs(1)
    t0 = time.perf_counter()
    for start in range(0, args.series, BATCH):  # through the real ingest path, so rollups exist
        metrics_ingest(
            run_id=run.pk,
            points=[
                Point("loss", s, math.sin(s / 5000) + ((s * 7919) % 101) / 500, 1.7e9 + s)
                for s in range(start, min(start + BATCH, args.series))
            ],
        )
    load_s = time.perf_counter() - t0
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE tracking_metricpoint")
        cur.execute("VACUUM ANALYZE tracking_metricrollup")

    def downsampled():
        s = selectors.metric_series(run_id=run.pk, key="loss", max_points=args.max_points)
        assert s.downsampled and len(s.steps) <= args.max_points
        return s

    def scan():  # the portable path, on the same database
        series = selectors.Series(key="loss")
        width, _ = selectors.bucket_width(0, args.series - 1, args.max_points)
        selectors._downsample_scan(series, "tracking_metricpoint", "", [run.pk, "loss"], width)
        return series

    def raw_group_by():  # one GROUP BY over the raw points (no rollups)
        width, _ = selectors.bucket_width(0, args.series - 1, args.max_points)
        with connection.cursor() as cur:
            cur.execute(
                "SELECT step / %s AS b, min(ARRAY[value, step::float8]), max(ARRAY[value, step::float8]) "
                "FROM tracking_metricpoint WHERE run_id = %s AND key = 'loss' GROUP BY b",
                [width, run.pk],
            )
            return cur.fetchall()

    def full_fetch():
        return list(
            MetricPoint.objects.filter(run_id=run.pk, key="loss")
            .order_by("step")
            .values_list("step", "value", "wall_time")
        )

    assert scan().steps == downsampled().steps  # both paths give the same points
    out = {"series_points": args.series, "load_s": load_s, "points_out": len(downsampled().steps)}
    out["downsampled_ms"] = timed(downsampled, args.repeats)
    out["scan_ms"] = timed(scan, max(1, args.repeats // 2))
    out["raw_group_by_ms"] = timed(raw_group_by, max(1, args.repeats // 2))
    out["full_fetch_ms"] = timed(full_fetch, max(1, args.repeats // 2))
    out["full_json_mb"] = len(json.dumps(full_fetch())) / 1e6
    out["http_ms"] = _http_query_ms(run, args)
    return out


def _http_query_ms(run, args: argparse.Namespace) -> float:
    """GET .../metrics?max_points=... through Django's full request path (test client, no socket)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    url = f"/api/runs/{run.pk}/metrics?keys=loss&max_points={args.max_points}"

    def get():
        resp = client.get(url)
        assert resp.status_code == 200, resp.content[:300]

    return timed(get, args.repeats)


def main() -> None:
    args = parse_args()
    setup_django(args.database_url)
    ingest = bench_ingest(args)
    baselines = bench_ingest_baselines()
    query = bench_query(args)
    print(
        f"ingest: {ingest['points']} points from {args.clients} clients x {args.batches} batches of {BATCH} "
        f"via {args.servers} daphne: {ingest['points_per_s']:,.0f} points/s "
        f"(batch p50 {ingest['p50_ms']:.0f} ms, p95 {ingest['p95_ms']:.0f} ms)"
    )
    print(
        f"  retries of every batch: inserted {ingest['retry_inserted']} rows "
        f"({ingest['retry_points_per_s']:,.0f} points/s checked)"
    )
    print(
        f"  in-process, one batch: service {baselines['service_points_per_s']:,.0f} points/s, "
        f"naive per-point ORM inserts {baselines['naive_points_per_s']:,.0f} points/s "
        f"({baselines['service_points_per_s'] / baselines['naive_points_per_s']:.0f}x)"
    )
    print(
        f"query: {query['series_points']:,} points -> {query['points_out']} (loaded in {query['load_s']:.1f} s)"
    )
    print(
        f"  downsampled (rollups) {query['downsampled_ms']:.1f} ms server time, {query['http_ms']:.1f} ms "
        f"through Django's request path"
    )
    print(
        f"  baselines: portable scan {query['scan_ms']:.0f} ms, GROUP BY over raw points "
        f"{query['raw_group_by_ms']:.0f} ms, undownsampled fetch {query['full_fetch_ms']:.0f} ms "
        f"({query['full_json_mb']:.0f} MB as JSON)"
    )


if __name__ == "__main__":
    main()

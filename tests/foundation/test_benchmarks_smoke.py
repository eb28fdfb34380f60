"""Every benchmark still runs: each script in ``benchmarks/`` takes ``--smoke`` (its full run's code paths,
every part, at tiny sizes, once) and ``benchmarks/run_all.py --smoke NAME`` runs it to exit 0. One test
per script, so that a failure names it; a script whose servers are not here is skipped with the reason
run_all gives. Scripts that start Ray, a web stack or worker processes are ``slow`` (measured times:
docs/benchmarks.md); the others run in the fast tier."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks import run_all
from tests.conftest import REPO_ROOT

# Under ~30 s and no Ray, web stack or worker processes: the rest start one or more (measured, 2 cores).
FAST = {"fresh_clone.py", "vllm_cpu.py"}
# Over ~100 s each on a loaded 2-core machine (docs/benchmarks.md): `extended`, so `make test` and
# `make bench-smoke` run them and the CI does not (together ~17 of the set's 22 minutes; beside pass 1
# they stretched the CI past 40 minutes).
EXTENDED = {
    "sweep_concurrency.py", "launcher_latency.py", "async_speedup.py", "follow_latency.py", "scale.py",
    "live_latency.py",
}  # fmt: skip
SCRIPTS = run_all.benchmark_scripts()


def test_every_benchmark_has_a_smoke_mode_that_run_all_runs():
    assert len(SCRIPTS) >= 14
    assert run_all.scripts_with("--smoke") == SCRIPTS


def _marks(name: str) -> tuple[pytest.MarkDecorator, ...]:
    if name in FAST:
        return ()
    return (pytest.mark.slow, pytest.mark.extended) if name in EXTENDED else (pytest.mark.slow,)


def _scratch_database(name: str) -> str:
    """A PostgreSQL database URL of this test process's own (the benchmark drops and creates it)."""
    base = run_all.BENCH_DATABASE_URL.rsplit("/", 1)[0]
    return f"{base}/rlp_bench_smoke_{name}_{os.getpid()}"


def _drop(url: str) -> None:
    import psycopg

    dbname = url.rsplit("/", 1)[1]
    with psycopg.connect(f"{url.rsplit('/', 1)[0]}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


@pytest.mark.parametrize(
    "script",
    [pytest.param(p, id=p.stem, marks=_marks(p.name)) for p in SCRIPTS],
)
def test_the_benchmark_runs_in_its_smoke_mode(script):
    reason = run_all.missing_server(script)
    if reason:
        pytest.skip(f"{script.name}: {reason}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "RLP_"))}
    database = _scratch_database(script.stem) if script.name in ("ingest.py", "webhook_outage.py") else None
    if database:
        env["BENCH_DATABASE_URL"] = database
    if os.environ.get("REDIS_URL"):  # the production pass's Redis database, not another's
        env["BENCH_REDIS_URL"] = os.environ["REDIS_URL"]
    try:
        proc = subprocess.run([sys.executable, "benchmarks/run_all.py", "--smoke", script.stem], cwd=REPO_ROOT,
                              env=env, capture_output=True, text=True, timeout=run_all.TIMEOUT_S + 60)  # fmt: skip
    finally:
        if database:
            _drop(database)
    assert proc.returncode == 0, (
        f"{script.name} --smoke failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    assert f"{script.name}" in proc.stdout and "  ok" in proc.stdout.splitlines()[-2], proc.stdout[-2000:]

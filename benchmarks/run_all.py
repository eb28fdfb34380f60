"""Every benchmark's smoke mode (``--smoke``), or quick mode (``--quick``, ``make bench``), one after the
other: a check that each still runs end to end, not the figures docs/benchmarks.md records (those come
from each script's full run, whose command the page gives).

``--smoke`` (CI: tests/foundation/test_benchmarks_smoke.py) runs every script: each takes ``--smoke``,
which runs the code paths of its full run (every part) at tiny sizes, once. ``--quick`` runs the scripts
that have a quick mode: larger, a few minutes in all. A script that needs a server this machine does not
answer on (PostgreSQL, Redis, a ``redis-server`` binary, py-spy's ptrace) is skipped with the reason.

    .venv/bin/python benchmarks/run_all.py --smoke               # every smoke mode
    .venv/bin/python benchmarks/run_all.py                       # every quick mode (make bench)
    .venv/bin/python benchmarks/run_all.py --smoke ingest scale  # some of them
    .venv/bin/python benchmarks/run_all.py --smoke --list        # which scripts have one
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 600  # per script: a smoke or quick mode that takes longer is broken
POSTGRES = "postgres://127.0.0.1:5432"


def benchmark_scripts() -> list[Path]:
    """Every benchmark script (helpers start with ``_``; this runner is none)."""
    return [
        p for p in sorted(HERE.glob("*.py")) if not p.name.startswith("_") and p.name != Path(__file__).name
    ]


def scripts_with(mode: str) -> list[Path]:
    """The benchmark scripts that take ``mode`` (``--smoke`` or ``--quick``)."""
    return [p for p in benchmark_scripts() if f'"{mode}"' in p.read_text()]


def _answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def _postgres(url: str) -> Callable[[], str | None]:
    return lambda: None if _answers(url, 5432) else f"no PostgreSQL answers at {urlsplit(url).netloc}"


def _redis(url: str) -> Callable[[], str | None]:
    return lambda: None if _answers(url, 6379) else f"no Redis answers at {urlsplit(url).netloc}"


def _redis_server() -> str | None:  # a private one, started and killed by the benchmark
    return None if shutil.which("redis-server") else "no redis-server on PATH"


def _ptrace() -> str | None:  # py-spy attaches to another process
    if not (Path(sys.executable).parent / "py-spy").exists():
        return "no py-spy beside this Python (requirements-dev.txt)"
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    if os.geteuid() != 0 and scope.exists() and scope.read_text().strip() != "0":
        return "py-spy cannot attach: not root and kernel.yama.ptrace_scope is not 0"
    return None


BENCH_DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rlp_bench")
BENCH_REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7")
# What each script needs beyond this checkout (a whole production stack: PostgreSQL and a private
# redis-server); scripts not named here need nothing (the embedded stack and Ray start locally).
NEEDS: dict[str, list[Callable[[], str | None]]] = {
    "ingest.py": [_postgres(BENCH_DATABASE_URL)],
    "webhook_outage.py": [_postgres(BENCH_DATABASE_URL), _redis(BENCH_REDIS_URL)],
    "live_latency.py": [_postgres(POSTGRES), _redis_server],
    "live_load.py": [_postgres(POSTGRES), _redis_server],
    "ingest_profile.py": [_postgres(POSTGRES), _redis_server, _ptrace],
}


def missing_server(script: Path) -> str | None:
    """Why the script cannot run here, or None."""
    for check in NEEDS.get(script.name, []):
        reason = check()
        if reason:
            return reason
    return None


def run(script: Path, mode: str) -> tuple[str, float]:
    reason = missing_server(script)
    if reason:
        return f"skipped: {reason}", 0.0
    print(f"\n=== {script.name} {mode}", flush=True)
    t0 = time.monotonic()
    try:
        done = subprocess.run([sys.executable, str(script), mode], cwd=HERE.parent, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"FAILED: over {TIMEOUT_S} s", time.monotonic() - t0
    status = "ok" if done.returncode == 0 else f"FAILED: exit {done.returncode}"
    return status, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("only", nargs="*", help="script names (without .py); default: all")
    ap.add_argument("--smoke", action="store_true", help="the smoke modes (default: the quick modes)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    mode = "--smoke" if args.smoke else "--quick"
    scripts = scripts_with(mode)
    if args.list:
        print("\n".join(p.name for p in scripts))
        return 0
    unknown = set(args.only) - {p.stem for p in scripts}
    if unknown:
        print(f"error: no {mode} mode in {', '.join(sorted(unknown))}; see {mode} --list", file=sys.stderr)
        return 2
    chosen = [p for p in scripts if not args.only or p.stem in args.only]
    t0 = time.monotonic()
    results = [(p.name, *run(p, mode)) for p in chosen]
    print(f"\n## {mode[2:]} modes ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end)")
    for name, status, seconds in results:
        print(f"{name:22} {seconds:6.0f} s  {status}")
    print(f"{'total':22} {time.monotonic() - t0:6.0f} s")
    return 1 if any(status.startswith("FAILED") for _, status, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())

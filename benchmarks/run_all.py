"""Every benchmark's quick mode, one after the other (``make bench``): a check, in a few minutes, that each
benchmark still runs end to end. A script has a quick mode when it takes ``--quick``; its figures are
smoke figures, not the ones docs/benchmarks.md records (those come from each script's full run, whose
command the page gives). A script whose quick mode needs a server this machine does not answer on (the
ingestion benchmark's PostgreSQL) is skipped with the reason.

    .venv/bin/python benchmarks/run_all.py               # every quick mode
    .venv/bin/python benchmarks/run_all.py ingest scale  # some of them
    .venv/bin/python benchmarks/run_all.py --list        # which scripts have one
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 600  # per script: a quick mode that takes longer is broken


def quick_scripts() -> list[Path]:
    """The benchmark scripts that take ``--quick`` (helpers start with ``_``)."""
    return [
        p
        for p in sorted(HERE.glob("*.py"))
        if not p.name.startswith("_") and p.name != Path(__file__).name and '"--quick"' in p.read_text()
    ]


def _answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def missing_server(script: Path) -> str | None:
    """Why the script's quick mode cannot run here, or None."""
    if script.name == "ingest.py":
        url = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rlp_bench")
        if not _answers(url, 5432):
            return f"no PostgreSQL answers at {urlsplit(url).netloc} (set BENCH_DATABASE_URL)"
    if script.name == "live_load.py":  # a whole production stack: PostgreSQL and a private redis-server
        if not _answers("postgres://127.0.0.1:5432", 5432):
            return "no PostgreSQL answers at 127.0.0.1:5432"
        if shutil.which("redis-server") is None:
            return "no redis-server on PATH"
    return None


def run(script: Path) -> tuple[str, float]:
    reason = missing_server(script)
    if reason:
        return f"skipped: {reason}", 0.0
    print(f"\n=== {script.name} --quick", flush=True)
    t0 = time.monotonic()
    try:
        done = subprocess.run([sys.executable, str(script), "--quick"], cwd=HERE.parent, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"FAILED: over {TIMEOUT_S} s", time.monotonic() - t0
    status = "ok" if done.returncode == 0 else f"FAILED: exit {done.returncode}"
    return status, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("only", nargs="*", help="script names (without .py); default: all")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    scripts = quick_scripts()
    if args.list:
        print("\n".join(p.name for p in scripts))
        return 0
    unknown = set(args.only) - {p.stem for p in scripts}
    if unknown:
        print(f"error: no quick mode in {', '.join(sorted(unknown))}; see --list", file=sys.stderr)
        return 2
    chosen = [p for p in scripts if not args.only or p.stem in args.only]
    t0 = time.monotonic()
    results = [(p.name, *run(p)) for p in chosen]
    print(f"\n## quick modes ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end)")
    for name, status, seconds in results:
        print(f"{name:22} {seconds:6.0f} s  {status}")
    print(f"{'total':22} {time.monotonic() - t0:6.0f} s")
    return 1 if any(status.startswith("FAILED") for _, status, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())

"""How long a fresh clone waits for its demo URL: ``git clone``, then ``make demo`` in the clone with its
own virtual environment, until the demo prints its dashboard URL (then the demo is stopped).

Splits the wait into clone, install (until the Makefile's install stamps exist: pip, and for the old
Makefile Debian's Chromium), and start (migrate, server and worker up, the demo run launched). Run it
for two commits to compare; the pip cache and the system packages present are whatever this machine has
(say which when quoting figures).

    .venv/bin/python benchmarks/fresh_clone.py --commit a55cc87 --commit HEAD
    .venv/bin/python benchmarks/fresh_clone.py --smoke    # HEAD, with a stand-in for `make demo`

``--smoke`` checks the measurement itself in seconds: the clone and checkout, the demo's process group
and its SIGINT, the stamps and the URL line read as they come, with a stand-in for ``make demo`` that
writes the install stamp, prints the URL line and waits to be stopped (no virtual environment is built:
that is the slow part the full run measures).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAMPS = (".venv/.installed", ".venv/.installed-runtime")  # the old Makefile's, the new one's
STAMPS_NEW = STAMPS[1]
URL_LINE = "Demo run launched"
# The stand-in for `make demo`: the install stamp, the URL line, then running until SIGINT stops it (Python
# sets its handler even where SIGINT was ignored on entry, as in a background job, which a shell cannot).
SMOKE_DEMO = [
    sys.executable,
    "-c",
    "import pathlib, signal, sys, time\n"
    "signal.signal(signal.SIGINT, lambda *_: sys.exit(130))\n"
    f"pathlib.Path({STAMPS_NEW!r}).parent.mkdir()\n"
    f"pathlib.Path({STAMPS_NEW!r}).touch()\n"
    f"print({URL_LINE!r} + ': http://127.0.0.1/', flush=True)\n"
    "time.sleep(600)\n",
]


def measure(commit: str, workdir: Path, timeout_s: float, demo: list[str] | None = None) -> dict[str, object]:
    clone = workdir / f"clone-{commit[:10]}"
    t0 = time.monotonic()
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", commit], check=True)
    t_clone = time.monotonic() - t0
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "VIRTUAL_ENV", "VAR_DIR")
    }
    env["DEMO_PORT"] = "0"
    log = (workdir / f"demo-{commit[:10]}.log").open("w")
    proc = subprocess.Popen(demo or ["make", "demo"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                            start_new_session=True)  # fmt: skip
    t_install = t_url = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if t_install is None and any((clone / s).exists() for s in STAMPS):
                t_install = time.monotonic() - t0
            if URL_LINE in line:
                t_url = time.monotonic() - t0
                break
            if time.monotonic() - t0 > timeout_s:
                break
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # the demo stops its server, worker and Ray head
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    venv_mb = sum(f.stat().st_size for f in (clone / ".venv").rglob("*") if f.is_file()) / 2**20
    return {"commit": commit, "clone_s": round(t_clone, 1), "install_done_s": round(t_install or 0, 1),
            "url_s": round(t_url, 1) if t_url else None, "venv_mb": round(venv_mb)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", action="append", help="repeatable; measured in order")
    parser.add_argument("--timeout", type=float, default=3600, help="per commit, from the clone")
    parser.add_argument("--keep", action="store_true", help="keep the clones")
    parser.add_argument("--smoke", action="store_true", help="HEAD with a stand-in for `make demo` (seconds)")
    args = parser.parse_args()
    if args.smoke:
        args.commit, args.timeout = args.commit or ["HEAD"], 120
    elif not args.commit:
        parser.error("--commit is required (or --smoke)")
    workdir = Path(tempfile.mkdtemp(prefix="rlp-fresh-clone-"))
    try:
        for commit in args.commit:
            sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", commit], check=True, capture_output=True,
                                 text=True).stdout.strip()  # fmt: skip
            result = measure(sha, workdir, args.timeout, SMOKE_DEMO if args.smoke else None)
            if args.smoke and not (result["url_s"] and result["install_done_s"]):
                raise SystemExit(f"error: the stand-in demo was not seen through: {result}")
            print(json.dumps(result), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

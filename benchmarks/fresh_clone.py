"""How long a fresh clone waits for its demo URL: ``git clone``, then ``make demo`` in the clone with its
own virtual environment, until the demo prints its dashboard URL (then the demo is stopped).

Splits the wait into clone, install (until the Makefile's install stamps exist: pip, and for the old
Makefile Debian's Chromium), and start (migrate, server and worker up, the demo run launched). Run it
for two commits to compare; the pip cache and the system packages present are whatever this machine has
(say which when quoting figures).

    .venv/bin/python benchmarks/fresh_clone.py --commit a55cc87 --commit HEAD
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
URL_LINE = "Demo run launched"
STAMPS = (".venv/.installed", ".venv/.installed-runtime")  # the old Makefile's, the new one's


def measure(commit: str, workdir: Path, timeout_s: float) -> dict[str, object]:
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
    proc = subprocess.Popen(["make", "demo"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
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
    parser.add_argument("--commit", action="append", required=True, help="repeatable; measured in order")
    parser.add_argument("--timeout", type=float, default=3600, help="per commit, from the clone")
    parser.add_argument("--keep", action="store_true", help="keep the clones")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rlp-fresh-clone-"))
    try:
        for commit in args.commit:
            sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", commit], check=True, capture_output=True,
                                 text=True).stdout.strip()  # fmt: skip
            print(json.dumps(measure(sha, workdir, args.timeout)), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

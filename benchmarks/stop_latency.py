"""How long a graceful stop takes against how long a trainer step is, and what it keeps.

A run of a preset (``python -m rl_engine train``, its own process and Ray session) gets SIGTERM a few
seconds after its first step is logged, while step 2 trains; the figures per repeat: seconds from SIGTERM
to the process's exit (``stop_s``), the length of a trainer step (step 1's ``timing/train_s``), the
engine's own estimate of what a stop needs (its last ``stop_grace_s``), whether step 2 was abandoned
between micro-batches, and the step of the checkpoint it kept (it must be the last completed step). The baseline is the step itself: before
the engine could leave a step, a stop waited for it to end (``stop_s`` >= the rest of the step plus the
checkpoint), longer than the platform's 5 s grace, so the job was killed and kept nothing. Medians and
``stop_s / train_s`` over the repeats; JSON to ``--out``.

    .venv/bin/python benchmarks/stop_latency.py --smoke                     # a tiny model (CI)
    .venv/bin/python benchmarks/stop_latency.py --repeats 3 --out var/bench/stop-latency   # SmolLM2

Needs the model for the full run (``make model``).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 1800

# The smoke's step: demo-cpu's tiny model with 2-row micro-batches, so a step has many stop points.
SMOKE_SETTINGS = [
    "trainer.batch_size=32",
    "trainer.mini_batch_size=32",
    "trainer.micro_batch_size=2",
    "trainer.total_steps=20",
    "rollout.n=4",
]
FULL_SETTINGS = ["trainer.total_steps=6"]
# No evaluation: the stop is measured inside a trainer step, and each run's checkpoint only at the stop.
COMMON = [
    "logging.log_every=1",
    "eval.before_training=false",
    "eval.every=0",
    "eval.at_end=false",
    "trainer.checkpoint_every=0",
]


def one_stop(preset: str, settings: list[str], after_s: float, work: Path) -> dict[str, Any]:
    """Start the run, SIGTERM ``after_s`` after step 1 is logged, wait for the exit; its figures."""
    run_dir, ckpt_dir = work / "run", work / "checkpoints"
    cmd = [sys.executable, "-m", "rl_engine", "train", "--config", f"preset:{preset}",
           "--run-dir", str(run_dir), "--checkpoint-dir", str(ckpt_dir),
           "--set", "logging.sinks=[stdout,jsonl]"]  # fmt: skip
    for s in [*COMMON, *settings]:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    sent: float | None = None
    lines: list[str] = []
    deadline = time.monotonic() + RUN_TIMEOUT_S
    for line in proc.stdout:
        lines.append(line)
        if sent is None and line.startswith("step 1 |"):
            time.sleep(after_s)
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
        if time.monotonic() > deadline:
            proc.kill()
            break
    proc.wait()
    stop_s = time.monotonic() - sent if sent is not None else None
    if sent is None:
        raise RuntimeError("the run ended before its first step was logged:\n" + "".join(lines[-30:]))
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    step1 = next(r["metrics"] for r in records if r.get("type") == "metrics" and r.get("step") == 1)
    events = [r for r in records if r.get("type") == "event"]
    graces = [e["data"]["stop_grace_s"] for e in events if "stop_grace_s" in (e.get("data") or {})]
    kept = [e["data"]["step"] for e in events if e.get("kind") == "checkpoint"]
    logged = [r["step"] for r in records if r.get("type") == "metrics"]
    return {
        "stop_s": round(stop_s, 2),
        "train_s": round(float(step1["timing/train_s"]), 2),
        "stop_gap_max_s": round(float(step1.get("timing/stop_gap_max_s", 0.0)), 2),
        "engine_estimate_s": graces[-1] if graces else None,
        "abandoned": any("abandoned" in (e.get("message") or "") for e in events),
        "kept_step": kept[-1] if kept else None,
        "last_completed_step": max(logged),
        "exit_code": proc.returncode,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="demo-cpu's tiny model, one repeat (seconds)")
    ap.add_argument("--preset", default="smollm2-arith-cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--after", type=float, default=8.0, help="seconds after step 1 is logged")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    preset, settings = ("demo-cpu", SMOKE_SETTINGS) if args.smoke else (args.preset, FULL_SETTINGS)
    repeats, after = (1, 0.0) if args.smoke else (args.repeats, args.after)
    runs = []
    for i in range(repeats):
        with tempfile.TemporaryDirectory(prefix="stop-latency-") as tmp:
            runs.append(one_stop(preset, settings, after, Path(tmp)))
        print(json.dumps({"repeat": i, **runs[-1]}), flush=True)
    summary = {
        "preset": preset,
        "repeats": repeats,
        "sigterm_after_step1_s": after,
        "median_stop_s": statistics.median(r["stop_s"] for r in runs),
        "median_train_s": statistics.median(r["train_s"] for r in runs),
        "median_stop_over_step": statistics.median(r["stop_s"] / max(r["train_s"], 1e-9) for r in runs),
        # what a stop must keep: the last completed step, always
        "every_stop_kept_the_last_completed_step": all(
            r["kept_step"] == r["last_completed_step"] and r["exit_code"] == 0 for r in runs
        ),
        "runs": runs,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "stop_latency.json").write_text(json.dumps(summary, indent=2))
    return 0 if summary["every_stop_kept_the_last_completed_step"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m rl_engine train`` end to end through the pipeline driver, in a subprocess with its own
private Ray instance: a normal run, a crashing actor, and SIGTERM as a graceful stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cmd(tmp: Path, *sets: str, placement: tuple[str, ...] = ()) -> list[str]:
    base = [
        f"model.path={tmp / 'model'}",
        "logging.sinks=[jsonl]",
        "logging.log_every=1",
        "rollout.n=4",
        "trainer.batch_size=16",
        "trainer.mini_batch_size=16",
    ]
    out = [sys.executable, "-m", "rl_engine", "train", "--config", "preset:demo-cpu"]
    for s in [*base, *sets]:
        out += ["--set", s]
    return [*out, "--jsonl-path", str(tmp / "run.jsonl"), "--no-progress-bar", *placement]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", PYTHONPATH=str(ROOT))
    return env


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_cli_train_runs_the_pipeline_and_exits_zero(tmp_path):
    proc = subprocess.run(
        _cmd(tmp_path, "trainer.total_steps=3", placement=("--checkpoint-dir", str(tmp_path / "ck"))),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps_done"] == 3 and summary["samples_trained"] == 48
    text = (tmp_path / "run.jsonl").read_text()
    assert "async/staleness_max" in text and "checkpoint" in text
    assert (tmp_path / "ck" / "step_00000003").is_dir()


@pytest.mark.extended  # ~1 min; a failing actor's error runs in CI in tests/pipeline/test_pipeline_invariants.py
def test_cli_train_with_a_crashing_actor_exits_nonzero_with_one_line(tmp_path):
    not_a_checkpoint = tmp_path / "empty"
    not_a_checkpoint.mkdir()
    proc = subprocess.run(
        _cmd(tmp_path, "trainer.total_steps=3", placement=("--resume-from", str(not_a_checkpoint))),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [
        f"error: resume failed: FileNotFoundError: {not_a_checkpoint} is not a checkpoint "
        "(no trainer_state.json)"
    ]
    assert "Traceback" not in proc.stderr.split(errors[0])[0].splitlines()[-1]


@pytest.mark.timeout(300)
def test_cli_sigterm_stops_gracefully_with_a_checkpoint(tmp_path):
    proc = subprocess.Popen(
        _cmd(tmp_path, "trainer.total_steps=100000", placement=("--checkpoint-dir", str(tmp_path / "ck"))),
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 200
        while not any(r.get("type") == "metrics" or "step" in r for r in _records(tmp_path / "run.jsonl")):
            assert proc.poll() is None and time.monotonic() < deadline, "no metrics arrived"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped"] is True and summary["steps_done"] >= 1
    assert Path(summary["last_checkpoint"]).is_dir()
    assert any(
        "checkpoint" in json.dumps(r) and "size_bytes" in json.dumps(r)
        for r in _records(tmp_path / "run.jsonl")
    )

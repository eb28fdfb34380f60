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
FAST = {"fresh_clone.py", "vllm_cpu.py", "rg_task_probe.py", "step_bound.py"}
# Over ~100 s each on a loaded 2-core machine (docs/benchmarks.md): `extended`, so `make test` and
# `make bench-smoke` run them and the CI does not (together ~17 of the set's 22 minutes; beside pass 1
# they stretched the CI past 40 minutes).
EXTENDED = {
    "sweep_concurrency.py", "launcher_latency.py", "async_speedup.py", "follow_latency.py", "scale.py",
    "live_latency.py",
}  # fmt: skip
SCRIPTS = run_all.benchmark_scripts()
# Scripts whose smoke a test of their own below runs (and checks the report of): not run twice.
OWN_TEST = {"peer_trl.py"}


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
    [pytest.param(p, id=p.stem, marks=_marks(p.name)) for p in SCRIPTS if p.name not in OWN_TEST],
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


@pytest.mark.slow
def test_peer_trl_smoke_runs_both_trainers_on_the_same_held_out_prompts(tmp_path):
    """TRL's GRPOTrainer and one engine run, 2 steps each on the tiny model: both evaluated before
    training and after each step by the same evaluator on the same prompts, in one JSON and one PNG."""
    import json

    proc = subprocess.run([sys.executable, "benchmarks/peer_trl.py", "--smoke", "--out", str(tmp_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=run_all.TIMEOUT_S)  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    report = json.loads((tmp_path / "report.json").read_text())
    assert [c["label"] for c in report["curves"]] == ["trl-grpo-s0", "hf-fully_async-s0"]
    for curve in report["curves"]:
        assert curve["error"] is None
        assert [e["step"] for e in curve["evals"]] == [0, 1, 2], curve["label"]
        assert [s["step"] for s in curve["steps"]] == [1, 2], curve["label"]
        assert all(s["step_s"] > 0 and s["wall_s"] > 0 for s in curve["steps"]), curve["label"]
    trl, engine = report["runs"]
    assert report["same_eval_prompts"] is True
    assert trl["eval_prompts"]["fingerprint"] == engine["eval_prompts"]["fingerprint"]
    assert engine["eval_prompts"]["reported"] == [engine["eval_prompts"]["count"]] * 3
    assert trl["prompt_tokens_equal"] is True and trl["train_prompts"] == 4
    assert trl["versions"]["trl"] == "1.16.0"
    settings = {k: v["value"] for k, v in trl["settings"].items()}
    assert settings["loss_type"] == "dapo" and settings["beta"] == 0.0 and settings["num_iterations"] == 1
    assert settings["per_device_train_batch_size"] == 16 and settings["num_generations"] == 8
    assert report["png"] and (tmp_path / "curves.png").stat().st_size > 0

"""The real-shaped workflow on CPU, end to end: ``train --config preset:gsm8k-style-tiny-cpu`` (a generated
GSM8K-format dataset through ``datasets``, the tiny model's chat template, math-verify scoring in the
rollouter's thread, held-out evaluation before training and at the end, MLflow and W&B mirrors in their
offline forms, all in the run folder the placement names: ``--run-dir``, as a platform job gets it), then
``export`` of the final checkpoint and a held-out evaluation of the exported model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.extended  # ~1.3 min; CI runs the same preset through the platform (tests/launcher/test_platform_presets.py)
def test_gsm8k_style_preset_trains_exports_and_evaluates(tmp_path):
    sets = [
        f"model.path={tmp_path / 'model'}", f"data.path={tmp_path / 'data'}", f"data.cache_dir={tmp_path / 'hf'}",
        "data.synthetic.train_size=64", "data.synthetic.test_size=8", "rollout.n=4", "trainer.batch_size=16",
        "trainer.mini_batch_size=16", "trainer.total_steps=3", "logging.sinks=[jsonl,mlflow,wandb]",
        "logging.log_every=1", "logging.wandb.mode=offline",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "rl_engine", "train", "--config", "preset:gsm8k-style-tiny-cpu",
           "--run-dir", str(tmp_path), "--checkpoint-dir", str(tmp_path / "ck"), "--no-progress-bar"]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["steps_done"] == 3
    assert "reward 'math_verify' failed" not in proc.stderr

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    metrics = [(r["step"], r["metrics"]) for r in records if r["type"] == "metrics"]
    assert [s for s, m in metrics if "reward/mean" in m] == [1, 2, 3]
    assert all(m["data/epoch"] == 0 and m["reward/errors"] == 0 for _, m in metrics if "reward/mean" in m)
    # the preset evaluates before training and at the end (eval.every = 50 is past this short run)
    val = {s: m for s, m in metrics if "val/reward_mean" in m}
    assert sorted(val) == [0, 3] and all(m["val/num_prompts"] == 8 for m in val.values())
    assert [m["val/param_version"] for _, m in sorted(val.items())] == [0, 3]
    assert all(0 <= m["val/pass@1"] <= 1 and m["val/reward_errors"] == 0 for m in val.values())
    assert not [r for r in records if r["type"] == "event" and r["kind"] == "alert"]  # both mirrors worked
    samples = [s for r in records if r["type"] == "samples" for s in r["samples"]]
    assert samples and all(s["prompt"].startswith("<s>user: ") and s["prompt"].endswith("</s>assistant: ")
                           for s in samples)  # fmt: skip
    assert all(s["answer"].split("\n")[-1].startswith("#### ") for s in samples)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("gsm8k-style-tiny-cpu").experiment_id])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")] == [1, 2, 3]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/pass_at_1")] == [0, 3]
    assert run.data.params["reward.name"] == "math_verify"
    assert len(list((tmp_path / "wandb").glob("wandb/offline-run-*/run-*.wandb"))) == 1
    assert (tmp_path / "mlflow-artifacts").is_dir()

    out = tmp_path / "exported"
    export = subprocess.run([sys.executable, "-m", "rl_engine", "export", "--checkpoint", str(tmp_path / "ck"),
                             "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)  # fmt: skip
    assert export.returncode == 0, export.stderr[-2000:]
    assert json.loads(export.stdout)["step"] == 3

    from rl_engine.backends import build_rollout_worker
    from rl_engine.config import load_yaml
    from rl_engine.evaluation import Evaluator

    cfg = load_yaml("preset:gsm8k-style-tiny-cpu", [s for s in sets if s.startswith(("data.", "rollout."))]
                    + [f"model.path={out}", "model.tiny=null", "eval.max_prompts=8"])  # fmt: skip
    worker = build_rollout_worker(cfg)
    result = Evaluator.from_config(cfg, worker.tokenizer).run(worker)
    assert result.metrics["val/num_prompts"] == 8 and 0.0 <= result.metrics["val/pass@1"] <= 1.0
    assert {s.prompt_uid for s in result.samples} == {f"v{i}" for i in range(8)}

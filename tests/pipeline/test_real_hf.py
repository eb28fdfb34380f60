"""The pipeline with the real HF rollout worker and PolicyTrainer on the tiny model (no simulation).

Parity: ``fully_async`` with trigger=1 and staleness=0 must produce the *same parameters* as ``sync``
(same seed), step for step; a run allowed one step of staleness must not (the test can tell them apart).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_engine.config import TinyModelSpec, apply_overrides, parse_config
from rl_engine.models.tiny import save_tiny_model
from rl_engine.pipeline import run_experiment
from rl_engine.presets import get_preset
from rl_engine.trainer.checkpoint import load_safetensors_dir
from tests.pipeline.conftest import RecordingSink


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(TinyModelSpec(seed=0), tmp_path_factory.mktemp("models") / "tiny-llama")


def _cfg(model_dir: Path, ckpt_dir: Path, *overrides: str):
    data = get_preset("demo-cpu")
    data["model"].pop("tiny")
    return parse_config(apply_overrides(data, [
        f"model.path={model_dir}", "rollout.n=4", "trainer.batch_size=16", "trainer.mini_batch_size=8",
        "trainer.total_steps=3", f"trainer.checkpoint_dir={ckpt_dir}", "logging.sinks=[]", "logging.log_every=1",
        "algorithm.entropy_coef=0.01", *overrides,
    ]))


def _final_params(summary) -> dict[str, torch.Tensor]:
    return load_safetensors_dir(Path(summary.last_checkpoint) / "model")


def test_fully_async_on_policy_reproduces_sync_parameters(ray_session, tiny_dir, tmp_path):
    runs = {}
    for name, extra in {
        "sync": ["pipeline.mode=sync"],
        "async_on_policy": ["pipeline.mode=fully_async", "pipeline.staleness_threshold=0",
                            "pipeline.trigger_parameter_sync_step=1", "pipeline.partial_rollout=true"],
        # the control: one step of staleness allowed (and TIS on, to see its importance ratios)
        "async_stale_tis": ["pipeline.mode=fully_async", "pipeline.staleness_threshold=1",
                            "pipeline.trigger_parameter_sync_step=1", "algorithm.off_policy=tis"],
    }.items():
        sink = RecordingSink()
        summary = run_experiment(_cfg(tiny_dir, tmp_path / name, *extra), sink)
        assert summary.steps_done == 3
        runs[name] = (_final_params(summary), sink)
    initial = load_safetensors_dir(tiny_dir)
    sync, on_policy, stale = (runs[k][0] for k in ("sync", "async_on_policy", "async_stale_tis"))
    assert any(not torch.equal(sync[k], initial[k]) for k in sync), "training changed nothing"
    for k in sync:
        torch.testing.assert_close(on_policy[k], sync[k], rtol=0, atol=1e-6)
    assert any(not torch.allclose(stale[k], sync[k], atol=1e-6) for k in sync)
    # and the metrics say why: on-policy never trained a stale sample, the staleness-1 run did
    assert {m["async/staleness_max"] for _, m in runs["async_on_policy"][1].metrics} == {0.0}
    stale_metrics = [m for _, m in runs["async_stale_tis"][1].metrics]
    assert max(m["async/staleness_max"] for m in stale_metrics) == 1.0
    # TIS: importance ratios recomputed against behaviour log-probs are reported; a stale step moves them off 1
    for m in stale_metrics:
        assert m["off_policy/is_ratio_mean"] > 0 and 0.0 <= m["off_policy/tis_clipfrac"] <= 1.0
        assert 0.0 <= m["actor/clipfrac"] <= 1.0
    assert any(m["off_policy/is_ratio_max"] > 1.0 + 1e-6 for m in stale_metrics[1:])

"""The pipeline with the real HF rollout worker and PolicyTrainer on the tiny model (no simulation).

Parity: ``fully_async`` with trigger=1 and staleness=0 must produce the *same parameters* as ``sync``
(same seed), step for step; a run allowed one step of staleness must not (the test can tell them apart).
No entropy bonus: the parameters move only through the rewards' advantages, so the rewards must be
right (each sample scored on its own) for training to change anything.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rl_engine.config import apply_overrides, parse_config
from rl_engine.jobspec import Placement
from rl_engine.pipeline import run_experiment
from rl_engine.presets import get_preset
from rl_engine.rewards import build_reward
from rl_engine.trainer.checkpoint import load_safetensors_dir
from rl_engine.types import Sample
from tests.pipeline.conftest import RecordingSink


def _cfg(model_dir: Path, *overrides: str):
    data = get_preset("demo-cpu")
    data["model"].pop("tiny")
    # a dense reward (a letter a-m anywhere in the 2-token response: ~40% of random-init samples), so
    # groups have unequal rewards from the first step; exact_match almost never pays at init
    data["reward"] = {"name": "format", "kwargs": {"pattern": "[a-m]", "full": False}}
    return parse_config(
        apply_overrides(
            data,
            [
                f"model.path={model_dir}",
                "rollout.n=4",
                "trainer.batch_size=16",
                "trainer.mini_batch_size=8",
                "trainer.total_steps=3",
                "logging.sinks=[]",
                "logging.log_every=1",
                "algorithm.entropy_coef=0",
                "logging.samples_per_step=16",
                *overrides,
            ],
        )
    )


def _final_params(summary) -> dict[str, torch.Tensor]:
    return load_safetensors_dir(Path(summary.last_checkpoint) / "model")


def _check_rewards(cfg, sink: RecordingSink) -> None:
    """Every trained sample (all 16 of each step are reported) carries its own reward, and some group
    has unequal rewards: otherwise every GRPO advantage is 0 and nothing could be learned."""
    reward_fn = build_reward(cfg.reward)
    mixed = 0
    for _, examples in sink.samples:
        assert len(examples) == 16
        groups: dict[str, list[float]] = {}
        for ex in examples:
            scored = Sample(
                prompt_uid="",
                group_id="",
                prompt_ids=[],
                response_ids=[],
                logprobs=[],
                finish_reason="stop",
                param_version_start=0,
                param_version_end=0,
                response_text=ex["response"],
                answer=ex["answer"],
            )
            assert ex["reward"] == reward_fn(scored), ex
            groups.setdefault(ex["prompt"], []).append(ex["reward"])
        mixed += sum(len(set(r)) > 1 for r in groups.values())
    assert mixed > 0, "no group with unequal rewards: every advantage was 0"


def test_fully_async_on_policy_reproduces_sync_parameters(ray_session, tiny_dir, tmp_path):
    runs = {}
    for name, extra in {
        "sync": ["pipeline.mode=sync"],
        "async_on_policy": [
            "pipeline.mode=fully_async",
            "pipeline.staleness_threshold=0",
            "pipeline.trigger_parameter_sync_step=1",
            "pipeline.partial_rollout=true",
        ],
        # the control: one step of staleness allowed (and TIS on, to see its importance ratios)
        "async_stale_tis": [
            "pipeline.mode=fully_async",
            "pipeline.staleness_threshold=1",
            "pipeline.trigger_parameter_sync_step=1",
            "algorithm.off_policy=tis",
        ],
    }.items():
        sink = RecordingSink()
        cfg = _cfg(tiny_dir, *extra)
        summary = run_experiment(cfg, sink, placement=Placement(checkpoint_dir=str(tmp_path / name)))
        assert summary.steps_done == 3
        _check_rewards(cfg, sink)
        runs[name] = (_final_params(summary), sink)
    initial = load_safetensors_dir(tiny_dir)
    sync, on_policy, stale = (runs[k][0] for k in ("sync", "async_on_policy", "async_stale_tis"))
    moved = [k for k in sync if not torch.equal(sync[k], initial[k])]
    assert len(moved) == len(sync), f"training left {set(sync) - set(moved)} unchanged"
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

"""A resumed run samples what the uninterrupted run sampled after the same checkpoint (sync mode, HF
backend, tiny model, real actors): the checkpoint holds the rollout workers' sampling random numbers and
the prompt streams' positions, and restores them (docs/pipeline.md, "Checkpoint and lossless resume")."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from rl_engine.config import TinyModelSpec, apply_overrides, parse_config
from rl_engine.jobspec import Placement
from rl_engine.models.tiny import save_tiny_model
from rl_engine.pipeline import run_experiment
from rl_engine.pipeline.checkpoint import checkpoint_path
from rl_engine.pipeline.components import Components, Factory
from rl_engine.presets import get_preset
from tests.pipeline.conftest import RecordingSink


def _cfg(model_dir: Path, *extra: str):
    preset = get_preset("demo-cpu")
    preset["model"].pop("tiny")
    return parse_config(apply_overrides(preset, [
        f"model.path={model_dir}", "pipeline.mode=sync", "rollout.backend=hf", "rollout.n=4",
        "rollout.max_new_tokens=6", "trainer.batch_size=16", "trainer.mini_batch_size=16",
        "trainer.total_steps=5", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=3", "logging.sinks=[]",
        *extra]))  # fmt: skip


def _recording(path: Path) -> Components:
    return Components(reward=Factory("tests.pipeline.recording_reward:recording_reward", {"path": str(path)}))


def _sampled(path: Path) -> dict[str, list[list[int]]]:
    """Response token ids per prompt, in the order they were scored."""
    out: dict[str, list[list[int]]] = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out[row["prompt_uid"]].append(row["response_ids"])
    return out


@pytest.mark.slow  # two real runs: ~65 s on a loaded machine
def test_a_resumed_run_samples_what_the_uninterrupted_run_sampled_after_the_checkpoint(ray_session, tmp_path):
    model = save_tiny_model(TinyModelSpec(seed=0), tmp_path / "model")
    ckpts = tmp_path / "ck"
    straight = run_experiment(  # 5 steps, a checkpoint at step 2 on the way
        _cfg(model), RecordingSink(), placement=Placement(checkpoint_dir=str(ckpts)),
        components=_recording(tmp_path / "straight.jsonl"),
    )  # fmt: skip
    assert straight.steps_done == 5
    resumed = run_experiment(  # from that checkpoint to step 5
        _cfg(model), RecordingSink(), placement=Placement(resume_from=str(checkpoint_path(ckpts, 2))),
        components=_recording(tmp_path / "resumed.jsonl"),
    )  # fmt: skip
    assert resumed.start_step == 2 and resumed.steps_done == 5
    a, b = _sampled(tmp_path / "straight.jsonl"), _sampled(tmp_path / "resumed.jsonl")
    samples = sum(len(v) for v in b.values())
    assert samples >= 2 * 16  # steps 4 and 5 at least (step 3's batch may have been queued already)
    assert set(b) <= set(a), sorted(set(b) - set(a))  # the same prompts (the stream's position restored)
    same = sum(x == y for uid in b for x, y in zip(a[uid][-len(b[uid]) :], b[uid], strict=True))
    assert same == samples, f"{same} of {samples} responses equal"
    # and it trains what the uninterrupted run trained after the checkpoint (16 samples a step)
    assert sorted(resumed.trained_uids) == sorted(straight.trained_uids[2 * 16 :])

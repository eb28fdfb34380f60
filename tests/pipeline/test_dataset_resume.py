"""A Hugging Face dataset through the real pipeline (HF worker, PolicyTrainer, Ray actors), stopped at a
checkpoint and resumed: the resumed run continues the epoch — every prompt position is trained exactly
once across the two runs, the same positions as an uninterrupted run, none repeated or skipped."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from rl_engine.config import TinyModelSpec, apply_overrides, parse_config
from rl_engine.jobspec import Placement
from rl_engine.models.tiny import save_tiny_model
from rl_engine.pipeline import run_experiment
from rl_engine.presets import get_preset
from tests.pipeline.conftest import RecordingSink


def _cfg(tmp: Path, model_dir: Path, *extra: str):
    import datasets

    data = tmp / "train.parquet"
    if not data.exists():  # 10 rows: a run of 6 steps x 4 prompts crosses two epoch boundaries
        datasets.Dataset.from_list(
            [{"q": f"add {i} {i + 1}", "a": str(2 * i + 1)} for i in range(10)]
        ).to_parquet(str(data))
    spec = {
        "source": "dataset",
        "path": str(data),
        "cache_dir": str(tmp / "hf"),
        "columns": {"prompt": "q", "answer": "a"},
    }
    preset = get_preset("demo-cpu")
    preset["model"].pop("tiny")
    return parse_config(apply_overrides(preset, [
        f"model.path={model_dir}", "data=" + json.dumps(spec), "pipeline.mode=sync", "rollout.n=4",
        "rollout.max_new_tokens=2", "trainer.batch_size=16", "trainer.mini_batch_size=16", "logging.sinks=[]",
        *extra]))  # fmt: skip


def _positions(uids: list[str]) -> list[int]:
    """Prompt positions of trained samples (uid ``p{position}/{k}``), one per prompt."""
    return sorted({int(u.split("/")[0][1:]) for u in uids})


@pytest.mark.slow
def test_a_resumed_run_continues_the_dataset_epoch(ray_session, tmp_path):
    model = save_tiny_model(TinyModelSpec(seed=0), tmp_path / "model")
    straight = run_experiment(_cfg(tmp_path, model, "trainer.total_steps=6"), RecordingSink())
    assert _positions(straight.trained_uids) == list(range(24))

    ckpts = tmp_path / "ck"
    first = run_experiment(_cfg(tmp_path, model, "trainer.total_steps=3"), RecordingSink(),
                           placement=Placement(checkpoint_dir=str(ckpts)))  # fmt: skip
    resumed = run_experiment(_cfg(tmp_path, model, "trainer.total_steps=6"), RecordingSink(),
                             placement=Placement(resume_from=first.last_checkpoint))  # fmt: skip
    assert resumed.start_step == 3 and resumed.steps_done == 6
    both = _positions(first.trained_uids) + _positions(resumed.trained_uids)
    counts = collections.Counter(both)
    assert sorted(counts) == list(range(24)) and set(counts.values()) == {1}, counts

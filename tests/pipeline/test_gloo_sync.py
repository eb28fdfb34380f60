"""``pipeline.sync_backend: gloo``: a real pipeline run (real PolicyTrainer, two real HF rollouters on the
tiny model) whose weights go by broadcast over a torch.distributed gloo group between the trainer actor
(rank 0) and the rollouters (ranks 1, 2). Every sync, each rollouter must hold exactly the trainer's
weights (digests of the rollout-dtype bytes, written by both sides: ``weight_digest.py``); a load that
fails is a pipeline error naming the rollouter (the run ends; the blocked broadcast is not waited for).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_engine.config import apply_overrides, parse_config
from rl_engine.pipeline import PipelineError, run_experiment
from rl_engine.pipeline.components import Components, Factory
from rl_engine.presets import get_preset
from tests.pipeline.conftest import RecordingSink
from tests.pipeline.weight_digest import read_log

pytestmark = pytest.mark.timeout(300)


def _cfg(model_dir: Path, *overrides: str):
    data = get_preset("demo-cpu")
    data["model"].pop("tiny")
    # a dense reward (a letter a-m anywhere in the response, ~40% of random-init samples): groups have
    # unequal rewards, so every step moves the weights
    data["reward"] = {"name": "format", "kwargs": {"pattern": "[a-m]", "full": False}}
    return parse_config(apply_overrides(data, [
        f"model.path={model_dir}", "rollout.n=4", "trainer.batch_size=16", "trainer.mini_batch_size=16",
        "trainer.total_steps=3", "pipeline.mode=fully_async", "pipeline.num_rollouters=2",
        "pipeline.sync_backend=gloo", "pipeline.sync_timeout_s=60", "logging.sinks=[]", "logging.log_every=1",
        *overrides]))  # fmt: skip


def _components(log: Path, fail_version: int | None = None) -> Components:
    worker = {"log": str(log), "fail_version": fail_version}
    return Components(
        worker=Factory("tests.pipeline.weight_digest:recording_worker", worker),
        trainer=Factory("tests.pipeline.weight_digest:recording_trainer", {"log": str(log)}),
        prepare=None,
    )


def test_a_gloo_run_trains_and_every_rollouter_holds_the_trainers_weights_after_each_sync(
    ray_session, tiny_dir, tmp_path
):
    log = tmp_path / "digests"
    sink = RecordingSink()
    summary = run_experiment(_cfg(tiny_dir), sink, components=_components(log))
    assert summary.steps_done == 3 and not summary.stopped
    sent = {v: d for who, v, d in read_log(log) if who == "trainer"}
    assert sorted(sent) == [1, 2]  # trigger 1: steps 1 and 2 sync; the last step's weights are not needed
    assert len(set(sent.values())) == 2  # training moved the weights between syncs
    for i in range(2):
        held = [(v, d) for who, v, d in read_log(log) if who == f"rollouter{i}"]
        assert held == sorted(sent.items()), f"rollouter {i}"  # each sync, in order, bit for bit
    synced = {step: m["timing/weight_sync_s"] for step, m in sink.metrics if "timing/weight_sync_s" in m}
    assert sorted(synced) == [1, 2] and all(s > 0 for s in synced.values())
    assert len(summary.sync_times_s) == 2


def test_a_failed_load_is_a_pipeline_error_naming_the_rollouter(ray_session, tiny_dir, tmp_path):
    log = tmp_path / "digests"
    cfg = _cfg(tiny_dir, "pipeline.num_rollouters=1")
    with pytest.raises(PipelineError, match=r"weight sync failed: .*rollouter 0: loading weights version 1 failed: "
                       r"ValueError: injected load failure"):  # fmt: skip
        run_experiment(cfg, RecordingSink(), components=_components(log, fail_version=1))
    assert not [row for row in read_log(log) if row[0].startswith("rollouter")]  # nothing recorded as loaded

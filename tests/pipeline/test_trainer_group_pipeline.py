"""The pipeline with a trainer group of two ranks (FSDP2 over gloo, two Ray actors in one placement
group): the run trains, syncs its weights to the rollouter, writes a sharded checkpoint, and ends with the
parameters the one-rank trainer reaches on the same run (sync mode, same seed), up to float summation
order. Also: the same run on a real two-node Ray cluster with the trainer ranks on one node and the
rollouter on the other (``multinode_run``, in its own process: it starts its own Ray cluster).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rl_engine.config import apply_overrides, parse_config
from rl_engine.export import export_checkpoint
from rl_engine.jobspec import Placement
from rl_engine.pipeline import run_experiment
from rl_engine.presets import get_preset
from rl_engine.trainer.checkpoint import load_safetensors_dir
from tests.pipeline.conftest import RecordingSink

LR = 3e-4


def group_cfg(model_dir: Path, *overrides: str):
    data = get_preset("demo-cpu")
    data["model"].pop("tiny")
    data["reward"] = {"name": "format", "kwargs": {"pattern": "[a-m]", "full": False}}
    return parse_config(
        apply_overrides(
            data,
            [
                f"model.path={model_dir}",
                "pipeline.mode=sync",
                "rollout.n=4",
                "trainer.batch_size=16",
                "trainer.mini_batch_size=8",
                "trainer.total_steps=3",
                f"trainer.lr={LR}",
                "trainer.precision=fp32",
                "resources.cpus_per_actor=0.5",
                "logging.sinks=[]",
                "logging.log_every=1",
                *overrides,
            ],
        )
    )


@pytest.mark.slow
def test_two_rank_group_trains_syncs_checkpoints_like_one_rank(ray_session, tiny_dir, tmp_path):
    one = run_experiment(
        group_cfg(tiny_dir), RecordingSink(), placement=Placement(checkpoint_dir=str(tmp_path / "one"))
    )
    sink = RecordingSink()
    two = run_experiment(
        group_cfg(tiny_dir, "trainer.world_size=2"),
        sink,
        placement=Placement(checkpoint_dir=str(tmp_path / "two")),
    )
    assert one.steps_done == two.steps_done == 3
    ckpt = Path(two.last_checkpoint)
    assert (ckpt / "dcp").is_dir() and json.loads((ckpt / "trainer_state.json").read_text())[
        "world_size"
    ] == 2
    assert [m["async/param_version"] for _, m in sink.metrics][-1] == 3  # the rollouter got every version
    exported = load_safetensors_dir(Path(export_checkpoint(ckpt, tmp_path / "hf").out))
    ref = load_safetensors_dir(Path(one.last_checkpoint) / "model")
    initial = load_safetensors_dir(tiny_dir)
    assert exported.keys() == ref.keys()
    for k in ref:
        assert not np.array_equal(ref[k].numpy(), initial[k].numpy()), k  # training moved it
        # the same samples (the rollouter got the group's weights), the same update
        assert float((exported[k] - ref[k]).abs().max()) <= 1e-2 * LR, k


@pytest.mark.slow
@pytest.mark.extended  # ~1 min (two `ray start` nodes); the group in the pipeline runs in CI in the test above
def test_trainer_ranks_and_rollouter_on_different_nodes_of_a_real_cluster(tiny_dir, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tests.pipeline.multinode_run", str(tiny_dir), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1200,  # the nodes start in ~30 s each at a load of 15 on 2 cores; the run takes minutes
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["steps_done"] == 2
    assert report["head"] != report["worker"]
    assert report["trainer_nodes"] == [report["head"]] * 2  # both ranks on the trainer node
    assert report["rollout_nodes"] == [report["worker"]]

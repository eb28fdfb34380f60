"""The real Rollouter (in this process, real MessageQueue actor) with the real vLLM / SGLang workers
on ASYNCIO STAND-INS of the engines (tests/engine/standin_*.py — not the engines: they need CUDA).

A weight update landing mid-generation with partial rollout on: the rollouter calls
``worker.interrupt()`` while holding its condition lock, then waits for the running call. This used
to deadlock with SGLang (the interrupt waited on the engine's loop, which the finishing generate
stopped). With the non-blocking interrupt the rollouter is safe as it is: the update returns, the
interrupted group resumes on the new weights and reaches the queue spanning versions 0..1.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import ray

from rl_engine.config import TinyModelSpec, apply_overrides, parse_config
from rl_engine.models.tiny import save_tiny_model
from rl_engine.pipeline.components import Components
from rl_engine.pipeline.knobs import knobs_from_config
from rl_engine.pipeline.queue import MessageQueue
from rl_engine.pipeline.rollouter import Rollouter
from rl_engine.presets import get_preset
from tests.engine import standin_vllm, standins

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(params=standins.BACKENDS)
def backend(request, monkeypatch):
    return standins.install(request.param, monkeypatch)


def _cfg(backend: str, model_dir):
    data = get_preset("demo-cpu")
    data["model"].pop("tiny")
    return parse_config(
        apply_overrides(
            data,
            [
                f"model.path={model_dir}",
                "resources.rollout_gpus=1",
                f"rollout={{backend: {backend}, n: 2, max_new_tokens: 300}}",
                "trainer.batch_size=4",
                "trainer.mini_batch_size=4",
                "pipeline.mode=fully_async",
                "pipeline.partial_rollout=true",
                "pipeline.prompts_per_call=1",
            ],
        )
    )


def _decoding(worker) -> bool:
    eng = worker.engine
    if isinstance(eng, standin_vllm.AsyncLLM):
        return len(eng.counts) == 2 and min(eng.counts.values()) >= 2
    reqs = [r for r in eng.tokenizer_manager.rid_to_state.values() if r.in_scheduler]
    return len(reqs) == 2 and min(len(r.out) for r in reqs) >= 2


def test_weight_update_mid_generation_interrupts_and_resumes(ray_session, backend, tmp_path):
    cfg = _cfg(backend, save_tiny_model(TinyModelSpec(seed=0), tmp_path / "tiny"))
    knobs = knobs_from_config(cfg)
    queue = ray.remote(MessageQueue).options(num_cpus=0).remote(knobs)
    rollouter = Rollouter(cfg, knobs, 0, 1, queue, Components(prepare=None))
    try:
        rollouter.start()
        ev = threading.Event()
        while not _decoding(rollouter.worker):
            assert not rollouter._error, rollouter._error
            ev.wait(0.002)
        stats = rollouter.update_weights([ray.put({"layer.w": np.full(3, 0.5, np.float32)})], 1)
        assert stats.total_s >= 0 and rollouter.worker.version == 1
        got = ray.get(queue.get.remote(2, 1, 30.0))
        assert got is not None, rollouter._error
        first = got.samples
        assert all((s.param_version_start, s.param_version_end) == (0, 1) for s in first)
        assert all(s.num_interruptions == 1 and len(s.response_ids) == 300 for s in first)
    finally:
        summary = rollouter.stop(timeout_s=20.0)
        ray.get(queue.close.remote())
    assert rollouter._error is None
    assert summary.alive is False

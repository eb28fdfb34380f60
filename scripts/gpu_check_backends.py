"""GPU check of the vLLM / SGLang rollout backends: one command on a GPU box with an engine installed.

    python scripts/gpu_check_backends.py [--engine vllm|sglang] [--max-new-tokens 512]

Runs each engine importable here (in-process, no Ray) on a random Qwen2.5-0.5B-shaped model (hidden
896, 24 layers, 14 heads; the char vocabulary of the tiny-model builder) in bf16:

1. generate, ``interrupt()`` from another thread mid-generation, update the weights (version 1),
   resume: every response keeps its prefix and spans versions 0..1;
2. behaviour log-probs vs the trainer's recomputation (``PolicyTrainer.compute_logprobs`` on CUDA):
   mean |diff| <= 1e-2;
3. the weight update's wall time (``sync_s``: the trainer's bucket stream, as the object-store sync
   sends it) and the generation rate;
4. with 2 GPUs, ``pipeline.sync_backend: nccl``: the trainer broadcasts new weights from GPU 1 while
   the engine receives them through its own path, then log-probs agree again (``broadcast``).

Prints one JSON object per engine and exits 1 if a check failed. Where neither engine nor CUDA is
available it prints why (``{"skipped": ...}``) and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LOGPROB_MEAN_ABS_MAX = 1e-2
SHAPE = {
    "architecture": "qwen2",
    "hidden_size": 896,
    "num_layers": 24,
    "num_heads": 14,
    "intermediate_size": 4864,
}


def skip_reason(engines: list[str]) -> str | None:
    """Why the check cannot run here (None: it can)."""
    if not engines:
        return "neither vllm nor sglang is importable in this environment (pip install -r requirements-gpu-vllm.txt)"
    import torch

    if not torch.cuda.is_available():
        return f"{', '.join(engines)} installed but no CUDA GPU is visible"
    return None


def _config(engine: str, model_dir: Path, max_new: int):
    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.presets import get_preset

    data = get_preset("demo-cpu")
    data["model"] = {
        "path": str(model_dir),
        "dtype": "bfloat16",
        "tiny": dict(SHAPE, max_position_embeddings=4096),
    }
    memory = "gpu_memory_utilization" if engine == "vllm" else "mem_fraction_static"
    rollout = (
        f"rollout={{backend: {engine}, n: 4, max_new_tokens: {max_new}, temperature: 0.8, {memory}: 0.3}}"
    )
    return parse_config(apply_overrides(data, [rollout, "resources.rollout_gpus=1"]))


def check_engine(engine: str, max_new: int) -> dict:

    from rl_engine.backends import build_rollout_worker
    from rl_engine.data import PromptStream
    from rl_engine.models import ensure_model
    from rl_engine.trainer import PolicyTrainer

    out: dict = {"engine": engine}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(engine, Path(tmp) / "qwen2.5-0.5b-shaped", max_new)
        ensure_model(cfg.model)
        worker = build_rollout_worker(cfg)
        try:
            prompts = PromptStream(cfg, worker.tokenizer).next_batch(8)
            trainer = PolicyTrainer(cfg, device="cuda")
            fresh = worker.generate(prompts[:4], cfg.rollout.n)
            recomputed = trainer.compute_logprobs(fresh)
            diffs = [
                abs(a - b)
                for s, r in zip(fresh, recomputed, strict=True)
                for a, b in zip(s.logprobs, r, strict=True)
            ]
            out["logprob_mean_abs"] = round(sum(diffs) / max(1, len(diffs)), 5)
            out["logprob_ok"] = out["logprob_mean_abs"] <= LOGPROB_MEAN_ABS_MAX
            box: dict = {}
            t0 = time.perf_counter()
            thread = threading.Thread(
                target=lambda: box.setdefault("s", worker.generate(prompts, cfg.rollout.n))
            )
            thread.start()
            threading.Event().wait(0.5)
            worker.interrupt()
            thread.join(120)
            partial = box.get("s", [])
            out["interrupt_returned"] = not thread.is_alive()
            out["aborted"] = sum(s.finish_reason == "abort" for s in partial)
            worker.clear_interrupt()
            _perturb(trainer)  # new weights: version 1, synced as the pipeline's object store path does
            t_sync = time.perf_counter()
            worker.update_weights(trainer.weight_stream(split=False), 1)
            out["sync_s"] = round(time.perf_counter() - t_sync, 3)
            done = worker.resume(partial)
            gen_s = time.perf_counter() - t0 - out["sync_s"]
            tokens = sum(len(s.response_ids) for s in done)
            out["tokens_per_s"] = round(tokens / gen_s, 1)
            out["prefixes_kept"] = all(
                a.response_ids[: len(b.response_ids)] == b.response_ids
                for a, b in zip(partial, done, strict=True)
            )
            out["version_span_ok"] = all(s.param_version_end == 1 for s in done if s.num_interruptions)
            out["all_finished"] = all(s.finish_reason in ("stop", "length") for s in done)
            out["broadcast"] = check_broadcast(engine, worker, trainer, prompts[:4], cfg.rollout.n)
        finally:
            worker.close()
    keys = ("interrupt_returned", "prefixes_kept", "version_span_ok", "all_finished", "logprob_ok")
    out["ok"] = bool(out["aborted"]) and all(out.get(k) for k in keys) and out["broadcast"].get("ok", True)
    return out


def _perturb(trainer) -> None:
    import torch

    with torch.no_grad():
        for p in trainer.model.parameters():
            p.mul_(1.01)


def check_broadcast(engine: str, worker, trainer, prompts, n: int) -> dict:
    """``pipeline.sync_backend: nccl``: the trainer's side (the backend's ``open_sender``, rank 0, on
    GPU 1: NCCL refuses two ranks on one device) broadcasts new weights while the worker receives them
    through the engine's own path (``init_weight_transfer`` + ``receive_weights``); then the behaviour log-probs
    must match the trainer's recomputation again (the weights landed)."""
    import socket

    import torch

    from rl_engine.backends import rollout_backend
    from rl_engine.types import TransferGroup
    from rl_engine.weights.broadcast import GroupInit

    if torch.cuda.device_count() < 2:
        return {"skipped": "needs 2 GPUs (the trainer's NCCL rank and the engine's on different devices)"}
    _perturb(trainer)
    stream = trainer.weight_stream(split=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    joined, box = threading.Event(), {}

    def send() -> None:
        try:
            torch.cuda.set_device(1)
            init = GroupInit("127.0.0.1", port, 2, 0, "nccl", timeout_s=300)
            sender = rollout_backend(engine).open_sender(init)
            joined.set()
            box["stats"] = sender.send(stream)
        except Exception as exc:  # reported in the result, not a traceback from a thread
            box["error"] = f"{type(exc).__name__}: {exc}"
            joined.set()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    max_bytes = stream.manifest.max_bucket_bytes
    worker.init_weight_transfer(TransferGroup("127.0.0.1", port, 1, 2, "nccl", 300.0, max_bytes))
    joined.wait(300)
    t0 = time.perf_counter()
    worker.receive_weights(stream.manifest, 2)
    thread.join(300)
    out: dict = {"sync_s": round(time.perf_counter() - t0, 3), "version": worker.version}
    if "error" in box:
        return {**out, "ok": False, "error": box["error"]}
    fresh = worker.generate(prompts, n)
    diffs = [
        abs(a - b)
        for s, r in zip(fresh, trainer.compute_logprobs(fresh), strict=True)
        for a, b in zip(s.logprobs, r, strict=True)
    ]
    out["logprob_mean_abs"] = round(sum(diffs) / max(1, len(diffs)), 5)
    out["ok"] = worker.version == 2 and out["logprob_mean_abs"] <= LOGPROB_MEAN_ABS_MAX
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["vllm", "sglang"], action="append")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    args = ap.parse_args(argv)
    wanted = args.engine or ["vllm", "sglang"]
    engines = [e for e in wanted if importlib.util.find_spec(e) is not None]
    reason = skip_reason(engines)
    if reason:
        print(json.dumps({"skipped": reason}))
        return 0
    results = [check_engine(e, args.max_new_tokens) for e in engines]
    for r in results:
        print(json.dumps(r))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

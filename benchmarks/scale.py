"""Engine at scale on a CPU: memory of the log-prob path at a 151,936 vocabulary, a Qwen2.5-0.5B-shaped
trainer step and streamed weight sync, and whether bf16 training learns. Prints one JSON object.

    .venv/bin/python benchmarks/scale.py            # the issue's shapes: 16 x 1,024 tokens, 494M-param
                                                    #   model (~12 GB of RAM at its peak, a few minutes)
    .venv/bin/python benchmarks/scale.py --quick    # smaller shapes, under a minute
    .venv/bin/python benchmarks/scale.py --smoke    # every part at tiny sizes: a check that it runs
    .venv/bin/python benchmarks/scale.py --parts logprobs,bf16

Parts (each memory figure is measured in a fresh child process: peak RSS is the kernel's high-water
mark (VmHWM) reset through /proc/self/clear_refs just before the measured operation, minus the RSS at
that moment):

* ``logprobs``: log-prob + entropy (in the loss) + backward over N sequences of 1,024 response tokens on
  a hidden-64 Qwen2 with the 151,936-token vocabulary. ``new``: the trainer's path (token-budget
  micro-batches, output layer in chunks). ``naive``: the path it replaced (the model's full logits,
  log-softmax, entropy), given its smallest micro-batch (1 sequence): its default, the whole
  mini-batch, needs ~10 GB per [16 x 1,024 x 151,936] float32 tensor. ``peak_ratio`` = new / naive
  peak increase (goal <= 0.10).
* ``sync``: a Qwen2.5-0.5B-shaped model served in bf16 (fp32 master weights, bf16 autocast): one trainer
  step (time, peak increase), then weight syncs to an in-process HF worker: the streamed sync's extra
  peak RSS against 1.25 x bucket + 5% of the model, and its time against a bare ``load_state_dict`` of
  the trainer's parameters into the worker (the in-process sync without buckets), interleaved, medians.
  The whole-model numpy copy that syncs used before is measured once for comparison.
* ``bf16``: fraction of parameters changed by 10 AdamW steps at lr 1e-6: fp32, bf16 (fp32 master
  weights), and the naive bf16 this replaced (bf16 parameters and AdamW state).
* ``rollout``: the HF rollouter's memory inside a real Ray actor (the ``Rollouter`` class a run creates,
  on a one-node ``ray start`` Ray, no ``MALLOC_*`` variable): 16 prompts of 128 tokens x 256 new tokens
  (quick: 64) in one micro-batch on a hidden-64 Llama with the 151,936-token vocabulary, on a thread of
  the actor as its generation loop runs them. Its peak RSS (absolute and above the start) against the
  weights it holds, what stays after, minor page faults per token. ``old``: the loop before (the model's
  own output layer and a [16, V] tensor per sampling operation; glibc's dynamic mmap threshold);
  ``buffers_only`` / ``heap_only``: one half of the change each; ``new``: logits and sampling in
  preallocated buffers and the rollouter's fixed mmap threshold (rl_engine.rollout.heap). Each variant
  ``--rollout-repeats`` times (quick: once), interleaved, each in a fresh actor, in the same invocation.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN_64 = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
}
SMALL_128 = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
}


# --- memory probes (Linux) ---------------------------------------------------------------------------
def _status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


class PeakRSS:
    """``with PeakRSS() as p: ...`` -> ``p.extra_mb``: peak RSS during the block minus RSS at its start."""

    def __enter__(self) -> PeakRSS:
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        self.base = _status_mb("VmRSS")
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.extra_mb = _status_mb("VmHWM") - self.base


# --- shared helpers ------------------------------------------------------------------------------------
def _cfg(model_dir: str, *overrides: str):
    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.presets import get_preset

    data = get_preset("demo-cpu")
    data["model"] = {"path": model_dir}
    return parse_config(apply_overrides(data, ["trainer.num_threads=2", *overrides]))


def _samples(n: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0) -> list[Any]:
    import torch

    from rl_engine.types import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(4, vocab, (prompt_len + response_len,), generator=g).tolist()
        out.append(
            Sample(
                prompt_uid=f"p{i}",
                group_id="g",
                prompt_ids=ids[:prompt_len],
                response_ids=ids[prompt_len:],
                logprobs=[-1.0] * response_len,
                finish_reason="length",
                param_version_start=0,
                param_version_end=0,
                reward=float(i % 2),
            )
        )
    return out


# --- children -------------------------------------------------------------------------------------------
def child_logprobs(
    model_dir: str, path: str, seqs: int, response_len: int, overrides: tuple[str, ...] = ()
) -> dict[str, Any]:
    import torch

    from rl_engine.models.batching import token_logprobs_and_entropy
    from rl_engine.trainer import PolicyTrainer
    from rl_engine.trainer.microbatch import select

    sizes = (f"trainer.batch_size={seqs}", f"trainer.mini_batch_size={seqs}", f"rollout.n={seqs}")
    trainer = PolicyTrainer(_cfg(model_dir, *sizes, *overrides))
    vocab = trainer.model.config.vocab_size
    batch = trainer.pack_samples(_samples(seqs, 16, response_len, vocab))
    adv = torch.randn(seqs, 1)
    n_tok = float(batch.response_mask.sum())
    model = trainer.model

    def loss_of(lp, ent, rows, mask):
        return (-(lp * adv[rows] * mask).sum() - 0.01 * (ent * mask).sum()) / n_tok

    with PeakRSS() as peak:
        if path == "new":
            parts = trainer._micro_batches(batch, torch.arange(seqs))
            for rows in parts:
                mb = select(batch, rows, trainer.pad_id)
                lp, ent = trainer._forward(trainer.policy, mb, with_entropy=True, entropy_grad=True)
                loss_of(lp, ent, rows, batch.response_mask[rows, : mb.width].float()).backward()
        else:  # the code this replaced: the shared left-padded layout with its mask, full logits
            parts = [torch.tensor([i]) for i in range(seqs)]
            width = batch.response_mask.shape[1]
            for rows in parts:
                logits = model(
                    input_ids=batch.input_ids[rows],
                    attention_mask=batch.attention_mask[rows],
                    position_ids=batch.position_ids[rows],
                    use_cache=False,
                    logits_to_keep=width + 1,
                ).logits[:, :-1]
                lp, ent = token_logprobs_and_entropy(logits, batch.response_ids[rows], 1.0, entropy_grad=True)
                del logits
                loss_of(lp, ent, rows, batch.response_mask[rows].float()).backward()
    return {
        "peak_extra_mb": peak.extra_mb,
        "seconds": peak.seconds,
        "micro_batches": len(parts),
        "chunk_tokens": trainer.chunk_tokens,
        "max_tokens_per_micro_batch": trainer.max_tokens,
    }


def child_sync(model_dir: str, seqs: int, response_len: int, bucket_mb: int, repeats: int) -> dict[str, Any]:
    import torch

    from rl_engine.backends.hf.worker import HFRolloutWorker
    from rl_engine.trainer import PolicyTrainer

    cfg = _cfg(
        model_dir,
        "model.dtype=bfloat16",
        f"trainer.batch_size={seqs}",
        f"trainer.mini_batch_size={seqs}",
        f"rollout.n={seqs}",
        f"trainer.weight_sync_bucket_mb={bucket_mb}",
        "rollout.num_threads=2",
    )
    trainer = PolicyTrainer(cfg)
    worker = HFRolloutWorker(cfg.rollout, cfg.model)
    params = sum(p.numel() for p in trainer.model.parameters())
    model_mb = params * 2 / 2**20  # in the rollout dtype
    samples = _samples(seqs, 32, response_len, trainer.model.config.vocab_size)
    t0 = time.perf_counter()
    for s, lp in zip(samples, trainer.compute_logprobs(samples), strict=True):
        s.logprobs = lp  # behaviour = current policy: the step sees ratio 1, as on-policy data does
    logprob_s = time.perf_counter() - t0
    with PeakRSS() as step:
        metrics = trainer.train_step(samples)
    state = {
        k: v for k, v in trainer.model.state_dict().items() if k in dict(worker.model.named_parameters())
    }
    # The worker's bf16 weights are still the safetensors file's pages (from_pretrained maps it): the
    # first write makes them private memory. Do that outside the measurement: it is not sync overhead.
    worker.model.load_state_dict(state, strict=False)
    with PeakRSS() as first:  # the first streamed sync: includes allocating the trainer's staging buffer
        worker.update_weights(trainer.weight_stream(), trainer.version)
    named = dict(trainer.model.named_parameters())
    exact = all(torch.equal(p, named[k].detach().to(p.dtype)) for k, p in worker.model.named_parameters())
    timings: dict[str, list[float]] = {"stream": [], "bare": [], "stream_cpu": [], "bare_cpu": []}
    for i in range(repeats):
        for name in ("stream", "bare") if i % 2 == 0 else ("bare", "stream"):
            t, c = time.perf_counter(), time.process_time()
            if name == "stream":
                worker.update_weights(trainer.weight_stream(), trainer.version)
            else:
                worker.model.load_state_dict(state, strict=False)
            timings[name].append(time.perf_counter() - t)
            timings[name + "_cpu"].append(time.process_time() - c)
    with PeakRSS() as old:  # what a sync cost before: a float32 numpy copy of the whole model, then a load
        worker.update_weights(trainer.weights_numpy(), trainer.version)
    med = {k: statistics.median(v) for k, v in timings.items()}
    stream_s, bare_s = med["stream"], med["bare"]
    bound = 1.25 * bucket_mb + 0.05 * model_mb
    return {
        "params_m": params / 1e6,
        "model_mb_bf16": model_mb,
        "bucket_mb": bucket_mb,
        "buckets": len(trainer.weight_stream().manifest.buckets),
        "logprob_pass_s": logprob_s,
        "step_s": step.seconds,
        "step_peak_extra_mb": step.extra_mb,
        "step_tokens": seqs * response_len,
        "step_pg_loss": metrics["actor/pg_loss"],
        "sync_extra_mb": first.extra_mb,
        "sync_extra_bound_mb": bound,
        "sync_extra_ok": first.extra_mb <= bound,
        "sync_first_s": first.seconds,
        "sync_s": stream_s,
        "bare_load_state_dict_s": bare_s,
        "sync_time_ratio": stream_s / bare_s,
        "sync_cpu_ratio": med["stream_cpu"] / med["bare_cpu"],  # CPU time: steadier on a shared machine
        "sync_time_ok": stream_s / bare_s <= 1.2,
        "sync_exact": exact,
        "sync_runs_s": timings["stream"],
        "bare_runs_s": timings["bare"],
        "whole_copy_sync_extra_mb": old.extra_mb,
        "whole_copy_sync_s": old.seconds,
    }


def child_bf16(model_dir: str, steps: int = 10) -> dict[str, Any]:
    import torch

    from rl_engine.trainer import PolicyTrainer

    base = ("trainer.batch_size=16", "trainer.mini_batch_size=16", "rollout.n=8", "trainer.lr=1e-6")
    samples = _samples(16, 12, 24, 54)
    out: dict[str, Any] = {}
    for name, extra in (
        ("fp32", ()),
        ("bf16", ("model.dtype=bfloat16",)),
        ("naive_bf16", ("model.dtype=bfloat16", "trainer.precision=fp32")),
    ):
        trainer = PolicyTrainer(_cfg(model_dir, *base, *extra))
        if name == "naive_bf16":  # what the trainer did before: bf16 parameters, so bf16 AdamW state
            trainer.model.to(torch.bfloat16)
            trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-6, betas=(0.9, 0.999))
            trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda _: 1.0)
        before = {k: p.detach().clone() for k, p in trainer.model.named_parameters()}
        for _ in range(steps):
            trainer.train_step(samples)
        changed = sum(int((p != before[k]).sum()) for k, p in trainer.model.named_parameters())
        served = sum(
            int((p.to(torch.bfloat16) != before[k].to(torch.bfloat16)).sum())
            for k, p in trainer.model.named_parameters()
        )
        total = sum(p.numel() for p in before.values())
        out[name] = {"changed_fraction": changed / total, "served_bf16_changed_fraction": served / total}
    out["bf16_minus_fp32"] = out["bf16"]["changed_fraction"] - out["fp32"]["changed_fraction"]
    out["within_1pct"] = abs(out["bf16_minus_fp32"]) <= 0.01
    return out


class _PlainSampler:
    """The decode loop's sampling before ``DecodeSampler``: every step allocates its [B, V] tensors."""

    def __init__(self, top_p: float) -> None:
        self.top_p = top_p

    def step(self, logits: Any, temperature: float, generator: Any) -> Any:
        import torch

        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        probs = logp.exp()
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = (sorted_p.cumsum(-1) - sorted_p) >= self.top_p
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


ROLLOUT_PROMPT_TOKENS = 128
# name -> (loop, heap): loop "plain" is the decode loop before (the model's own output layer, a [B, V]
# tensor per sampling operation), "in_place" today's (logits and sampling in preallocated buffers);
# heap False runs the actor with glibc's dynamic mmap threshold (RL_ENGINE_MALLOC_MMAP_THRESHOLD=0).
ROLLOUT_VARIANTS = {
    "old": ("plain", False),
    "buffers_only": ("in_place", False),
    "heap_only": ("plain", True),
    "new": ("in_place", True),
}


def _rollout_probe() -> type:
    """The Rollouter with one method more (``decode``); a class made here, where Ray is imported."""
    from rl_engine.pipeline.rollouter import Rollouter

    class RolloutProbe(Rollouter):
        """The Rollouter actor as a run builds it (its constructor fixes the heap, then builds the HF
        worker); ``decode`` generates on a thread of its own, as the actor's generation loop does."""

        def decode(self, seqs: int, prompt_tokens: int, loop: str) -> dict[str, Any]:
            import resource
            import threading

            from rl_engine.types import Prompt

            worker = self.worker
            if loop == "plain":  # the model's own output layer, the allocating sampling
                worker._body = None
                worker._sampler_for = lambda rows, vocab: _PlainSampler(self.cfg.rollout.top_p)
            weights_mb = sum(p.numel() * p.element_size() for p in worker.model.parameters()) / 2**20
            prompts = [
                Prompt(f"p{i}", [4 + (i * 131 + j * 7) % 4000 for j in range(prompt_tokens)], "", "", i)
                for i in range(seqs)
            ]
            out: dict[str, Any] = {}
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            with PeakRSS() as peak:
                t = threading.Thread(target=lambda: out.update(samples=worker.generate(prompts, 1)))
                t.start()
                t.join()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            tokens = sum(len(s.response_ids) for s in out["samples"])
            return {
                "heap": {"mmap_threshold": self.heap.threshold, "applied": self.heap.applied},
                "weights_mb": weights_mb,
                "rss_start_mb": peak.base,
                "peak_rss_mb": _status_mb("VmHWM"),
                "peak_extra_mb": peak.extra_mb,
                "peak_extra_over_weights": peak.extra_mb / weights_mb,
                "peak_rss_over_weights": _status_mb("VmHWM") / weights_mb,
                "after_extra_mb": _status_mb("VmRSS") - peak.base,
                "tokens": tokens,
                "minor_faults_per_token": faults / tokens,
                "seconds": peak.seconds,
            }

    return RolloutProbe


def measure_rollout(
    model_dir: str,
    variants: list[str],
    top_p: float,
    seqs: int,
    new_tokens: int,
    repeats: int,
    vocab: int = 151936,
) -> dict[str, list[dict[str, Any]]]:
    """Each variant ``repeats`` times, interleaved, each in a fresh Rollouter actor of the private Ray (one
    at a time): the HF worker decodes ``seqs`` prompts of ``ROLLOUT_PROMPT_TOKENS`` x ``new_tokens`` in one
    micro-batch. (Whether glibc's dynamic threshold lets the heap grow depends on the order of frees: the
    same run is flat once and grows by 1.76 GB the next; hence the repeats.)"""
    import ray

    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.pipeline.components import Components
    from rl_engine.pipeline.knobs import knobs_from_config
    from rl_engine.presets import get_preset
    from rl_engine.rollout.heap import MMAP_THRESHOLD_ENV

    data = get_preset("demo-cpu")
    # eos outside what random weights practically draw: every row decodes all its tokens
    data["model"] = {"path": model_dir, "generation_config": {"eos_token_id": vocab - 1}}
    cfg = parse_config(
        apply_overrides(
            data,
            [
                f"rollout.max_new_tokens={new_tokens}",
                f"rollout.micro_batch_size={seqs}",
                f"rollout.top_p={top_p}",
                "rollout.num_threads=2",
            ],
        )
    )
    probe = ray.remote(_rollout_probe())
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name in variants:
            loop, heap = ROLLOUT_VARIANTS[name]
            env = {"PYTHONPATH": str(ROOT)} | ({} if heap else {MMAP_THRESHOLD_ENV: "0"})
            actor = probe.options(num_cpus=0, max_concurrency=6, runtime_env={"env_vars": env}).remote(
                cfg, knobs_from_config(cfg), 0, 1, None, Components(prepare=None)
            )
            try:
                out[name].append(ray.get(actor.decode.remote(seqs, ROLLOUT_PROMPT_TOKENS, loop)))
            finally:
                ray.kill(actor)
    return out


@contextlib.contextmanager
def _private_ray(logs: Path) -> Any:
    """A one-node Ray of this benchmark (``ray start``, harness.ray_cluster: it starts under load too); its
    actors see no ``MALLOC_*`` variable (glibc as in a run)."""
    import ray

    from harness.ray_cluster import LocalRayCluster
    from rl_engine.rollout.heap import MMAP_THRESHOLD_ENV

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != MMAP_THRESHOLD_ENV}
    with LocalRayCluster(logs, env=env).started(head_cpus=2) as cluster:
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()


CHILDREN = {"logprobs": child_logprobs, "sync": child_sync, "bf16": child_bf16}


def _run_child(name: str, **kwargs: Any) -> dict[str, Any]:
    """Run ``CHILDREN[name](**kwargs)`` in a fresh interpreter (its own peak RSS); returns its JSON."""
    cmd = [sys.executable, __file__, "--child", name, "--child-args", json.dumps(kwargs)]
    # A fixed mmap threshold: every buffer over 128 KB is mapped and unmapped, so RSS follows live
    # memory (glibc's dynamic threshold would keep freed chunks of up to 32 MB in the heap, and a later
    # allocation would reuse them without raising RSS: the peak would depend on what ran before).
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False, env=env)
    if proc.returncode:
        raise RuntimeError(f"child {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller shapes: under a minute")
    ap.add_argument(
        "--smoke", action="store_true", help="every part at tiny sizes, once: a check that it runs"
    )
    ap.add_argument("--parts", default="logprobs,sync,bf16,rollout")
    ap.add_argument("--repeats", type=int, default=3, help="sync vs bare load_state_dict pairs")
    ap.add_argument("--rollout-repeats", type=int, default=2, help="runs of each rollout variant")
    ap.add_argument("--json", type=Path, help="also write the JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-args", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child](**json.loads(args.child_args))))
        return
    from transformers.utils import logging as hf_logging

    from rl_engine.config import TinyModelSpec
    from rl_engine.models.shaped import save_shaped_model
    from rl_engine.models.tiny import save_tiny_model

    hf_logging.disable_progress_bar()
    parts, t0 = args.parts.split(","), time.time()
    if args.smoke:  # the code paths of the full run at tiny sizes (run_all.py --smoke): figures mean nothing
        args.quick, args.repeats = True, 1
    vocab = 4096 if args.smoke else 151936  # the full runs' point is the large vocabulary; a smoke's is speed
    out: dict[str, Any] = {"quick": args.quick, "smoke": args.smoke, "cores": os.cpu_count(),
                           "load_avg_start": os.getloadavg()[0]}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="scale_") as tmp:
        if "logprobs" in parts:
            d = str(save_shaped_model(Path(tmp) / "h64", dtype="float32", **HIDDEN_64, vocab_size=vocab))
            seqs = 2 if args.quick else 16
            response_len = 64 if args.smoke else 1024
            res = {
                p: _run_child("logprobs", model_dir=d, path=p, seqs=seqs, response_len=response_len)
                for p in ("new", "naive")
            }
            res["sequences"], res["response_tokens"], res["vocab"] = seqs, response_len, vocab
            res["peak_ratio"] = res["new"]["peak_extra_mb"] / res["naive"]["peak_extra_mb"]
            res["peak_ratio_ok"] = res["peak_ratio"] <= 0.10
            out["logprobs"] = res
        if "sync" in parts:
            shape = {**SMALL_128, "vocab_size": vocab} if args.quick else {}
            d = str(save_shaped_model(Path(tmp) / "qwen", dtype="bfloat16", **shape))
            out["sync"] = _run_child(
                "sync",
                model_dir=d,
                seqs=2 if args.smoke else 4,
                response_len=8 if args.smoke else 32 if args.quick else 64,
                bucket_mb=1 if args.smoke else 4 if args.quick else 256,
                repeats=args.repeats,
            )
            out["sync"]["shape"] = (
                "hidden 128, 2 layers" if args.quick else "Qwen2.5-0.5B (hidden 896, 24 layers)"
            )
        if "bf16" in parts:
            out["bf16"] = _run_child(
                "bf16",
                model_dir=str(save_tiny_model(TinyModelSpec(), Path(tmp) / "tiny")),
                steps=1 if args.smoke else 10,
            )
        if "rollout" in parts:
            shape = {**HIDDEN_64, "vocab_size": vocab}
            d = str(save_shaped_model(Path(tmp) / "llama", dtype="float32", architecture="llama", **shape))
            new_tokens = 4 if args.smoke else 64 if args.quick else 256
            seqs = 2 if args.smoke else 16
            runs = (  # a smoke: both loops and both heaps, top-p sampling (its sort) included
                [(0.9, ["old", "new"])]
                if args.smoke
                else [(1.0, ["old", "new"])]
                if args.quick
                else [(1.0, list(ROLLOUT_VARIANTS)), (0.9, ["old", "new"])]
            )
            repeats = 1 if args.quick else args.rollout_repeats
            res: dict[str, Any] = {}
            with _private_ray(Path(tmp) / "ray"):
                for top_p, variants in runs:
                    res[f"top_p_{top_p}"] = measure_rollout(
                        d, variants, top_p, seqs, new_tokens, repeats, vocab
                    )
            res["sequences"], res["prompt_tokens"], res["new_tokens"] = (
                seqs,
                ROLLOUT_PROMPT_TOKENS,
                new_tokens,
            )
            res["shape"] = f"Llama, hidden 64, 2 layers, vocabulary {vocab:,}"
            out["rollout"] = res
    out["load_avg_end"], out["seconds"] = os.getloadavg()[0], time.time() - t0
    text = json.dumps(out, default=float)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=float))
    print(text)


if __name__ == "__main__":
    main()

"""A step against the bound: each phase's floating-point work, this machine's matmul throughput, and the
fraction of that bound each phase achieves (issue 42, item 3).

Three parts, one JSON report:

- **The work** (``count_*``, pure functions of the model's shape and the step's real token counts): the
  matmul FLOPs of generation (the HF rollout worker's prefill and KV-cached decode), of the old log-prob
  forward (``algorithm.off_policy`` tis / decoupled only: with ``none`` the engine computes none), and of
  the trainer's forward and backward, each split into what the real tokens need (``real``), what the
  code computes on padding (``padding``) and what it computes twice (``recompute``).
- **The bound**: ``torch.matmul`` throughput at the model's shapes (the decode's rows, a prefill's
  tokens, a trainer micro-batch's tokens; the MLP and output-layer widths), float32 and bfloat16, at 1
  thread (what each engine actor runs: ``rollout.num_threads`` and ``trainer.num_threads`` default to 1)
  and 2.
- **The phases for real**: the HF rollout worker and the ``PolicyTrainer`` as the engine builds them from
  the ``smollm2-arith-cpu`` preset (SmolLM2-135M-Instruct, 4 prompts x 8 = 32 samples of the preset's own
  data, 64 new tokens, float32, 1 thread each), timed, and each phase's achieved GFLOP/s as a fraction of
  the matmul bound at its own shape and of the best shape's. Generation is timed whole and with one new
  token (the prefill; decode is the difference); the trainer under both ``trainer.micro_batch_order``
  (``shuffled``: before; ``length``: after), side by side on the same batch.

    .venv/bin/python benchmarks/step_bound.py --out var/bench/step_bound.json   # SmolLM2, ~5 min
    .venv/bin/python benchmarks/step_bound.py --smoke                           # tiny model: it runs

Run it alone on the machine: the fractions come from one run (phase and bound measured side by side),
but two cores shared with anything else make the absolute times meaningless.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

SMOLLM2 = "var/models/smollm2-135m-instruct"
PRESET = "smollm2-arith-cpu"


# --- the work ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's sizes (a transformers Llama/Qwen2-style config)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @classmethod
    def of(cls, config: Any) -> Shape:
        heads = config.num_attention_heads
        return cls(
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            intermediate=config.intermediate_size,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            vocab=config.vocab_size,
            tied=bool(getattr(config, "tie_word_embeddings", False)),
        )

    @property
    def body_params(self) -> int:
        """Weights of the decoder layers' matmuls: q, k, v, o and the gated MLP's three (no norms)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.layers * (h * q + 2 * h * kv + q * h + 3 * h * self.intermediate)

    @property
    def head_params(self) -> int:
        """The output layer's weight (the embedding's when tied: still one matmul per token)."""
        return self.hidden * self.vocab


def forward_flops(shape: Shape, tokens: float, pairs: float, head_tokens: float) -> float:
    """Matmul FLOPs of one forward (2 per multiply-add)::

        2 * body_params * tokens                   # the layers' linear maps, every token the body runs on
      + 4 * layers * heads * head_dim * pairs      # attention: q.k and p.v per (query, key) pair
      + 2 * hidden * vocab * head_tokens           # the output layer, on the tokens whose logits are formed

    ``pairs``: (query, key) pairs the attention kernel computes, summed over rows. The embedding lookup,
    norms, rotary, activations and softmax are not matmuls and not counted (<1% at these shapes).
    A backward is twice a forward's matmuls (the gradient of each input and of each weight).
    """
    attn = 4 * shape.layers * shape.heads * shape.head_dim * pairs
    return 2 * shape.body_params * tokens + attn + 2 * shape.head_params * head_tokens


@dataclass(frozen=True)
class Work:
    """FLOPs of a phase: what the real tokens need, what padding costs, what is computed twice."""

    real: float
    padding: float = 0.0
    recompute: float = 0.0

    @property
    def total(self) -> float:
        return self.real + self.padding + self.recompute

    def __add__(self, other: Work) -> Work:
        return Work(self.real + other.real, self.padding + other.padding, self.recompute + other.recompute)

    def scaled(self, k: float) -> Work:
        return Work(self.real * k, self.padding * k, self.recompute * k)


def causal_pairs(length: int) -> int:
    """(query, key) pairs of a causal sequence of ``length`` tokens: L (L + 1) / 2."""
    return length * (length + 1) // 2


def count_generation(shape: Shape, prompt_lens: list[int], response_lens: list[int]) -> dict[str, Work]:
    """One micro-batch of the HF rollout worker (``rl_engine.backends.hf.worker``), as ``prefill`` and
    ``decode``: prompts left-padded to the longest, one prefill over all of it (the attention under a
    padding mask: every row attends over the whole padded square), logits for the last position only;
    then one cached forward per decode step for *every* row until the longest response is done (a
    finished row keeps decoding padding), its attention over the cache (padded prompt + the steps so
    far), logits for each row.

    A response of r tokens needs r - 1 cached forwards (its first token comes from the prefill's
    logits); the micro-batch runs max(r) - 1. Real work: each row's own prompt and its own steps."""
    rows, width = len(prompt_lens), max(prompt_lens)
    steps = max(response_lens) - 1
    real = forward_flops(shape, sum(prompt_lens), sum(causal_pairs(p) for p in prompt_lens), rows)
    computed = forward_flops(shape, rows * width, rows * width * width, rows)
    prefill = Work(real=real, padding=computed - real)
    real = computed = 0.0
    for s in range(1, steps + 1):  # the forward that feeds response token s - 1
        live = [p for p, r in zip(prompt_lens, response_lens, strict=True) if s < r]
        real += forward_flops(shape, len(live), sum(p + s for p in live), len(live))
        computed += forward_flops(shape, rows, rows * (width + s), rows)
    return {"prefill": prefill, "decode": Work(real=real, padding=computed - real)}


def count_logprob_forward(shape: Shape, micro_batches: list[list[tuple[int, int]]]) -> Work:
    """A no-grad log-prob forward (the old / proximal log-probs) over micro-batches of (prompt,
    response) lengths, as ``rl_engine.trainer.microbatch.select`` lays them out: each row left-aligned
    and right-padded to the micro-batch's longest, causal attention without a mask (the kernel computes
    each row's causal triangle of the padded length), the output layer on real response tokens only."""
    work = Work(0.0)
    for mb in micro_batches:
        width = max(p + r for p, r in mb)
        head = sum(r for _, r in mb)
        real = forward_flops(shape, sum(p + r for p, r in mb), sum(causal_pairs(p + r) for p, r in mb), head)
        computed = forward_flops(shape, len(mb) * width, len(mb) * causal_pairs(width), head)
        work = work + Work(real=real, padding=computed - real)
    return work


def count_train(shape: Shape, micro_batches: list[list[tuple[int, int]]]) -> dict[str, Work]:
    """The trainer's forward (as ``count_logprob_forward``) and backward (twice the forward) per
    micro-batch; the chunked output layer (``rl_engine.models.logprobs``) recomputes its logits in the
    backward: one more output-layer forward per response token, counted as ``recompute``."""
    fwd = count_logprob_forward(shape, micro_batches)
    head_tokens = sum(r for mb in micro_batches for _, r in mb)
    return {
        "train_forward": fwd,
        "train_backward": fwd.scaled(2.0) + Work(0.0, recompute=2 * shape.head_params * head_tokens),
    }


# --- the bound ---------------------------------------------------------------------------------------------


def matmul_gflops(
    m: int, k: int, n: int, dtype: str, threads: int, min_time_s: float = 0.3, stream_bytes: int = 0
) -> float:
    """Best-of-3 GFLOP/s of ``torch.matmul`` [m, k] @ [k, n] (2 m k n FLOPs) at ``threads`` threads,
    each a batch of calls lasting at least ``min_time_s``. ``stream_bytes``: the calls cycle through
    distinct [k, n] matrices of that many bytes in all (a decode step reads every layer's weights once:
    they are not in the cache the next time), else one matrix stays in the cache."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dt = getattr(torch, dtype)
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(m, k, generator=gen).to(dt)
        b0 = torch.randn(k, n, generator=gen).to(dt)
        copies = max(1, -(-stream_bytes // (b0.numel() * b0.element_size())))
        bs = [b0] + [b0.clone() for _ in range(copies - 1)]
        out = torch.empty(m, n, dtype=dt)
        torch.matmul(a, b0, out=out)  # warm-up
        best = 0.0
        for _ in range(3):
            calls, t0 = 0, time.perf_counter()
            while True:
                torch.matmul(a, bs[calls % copies], out=out)
                calls += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= min_time_s:
                    break
            best = max(best, 2.0 * m * k * n * calls / elapsed / 1e9)
        return best
    finally:
        torch.set_num_threads(before)


def cpu_features() -> dict[str, Any]:
    """torch's CPU capability and the bf16 matrix flags lscpu would show."""
    import torch

    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    wanted = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx2")
    return {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "flags": {f: f in flags for f in wanted}, "cpus": os.cpu_count()}  # fmt: skip


STREAM_BYTES = 256 * 2**20  # more than any last-level cache here: the weights come from memory


def bench_matmuls(shape: Shape, rows: dict[str, int], threads: list[int], min_time_s: float) -> list[dict]:
    """GFLOP/s at the model's widths (an MLP projection, the output layer) for each phase's rows; the
    decode's also with its weights streamed from memory (``streamed``), as a decode step reads them."""
    out = []
    widths = {"mlp": (shape.hidden, shape.intermediate), "head": (shape.hidden, shape.vocab)}
    for phase, m in rows.items():
        for wname, (k, n) in widths.items():
            for dtype in ("float32", "bfloat16"):
                for t in threads:
                    for streamed in (False, True) if phase == "decode" else (False,):
                        g = matmul_gflops(m, k, n, dtype, t, min_time_s, STREAM_BYTES if streamed else 0)
                        out.append({"rows_of": phase, "m": m, "k": k, "n": n, "width": wname, "dtype": dtype,
                                    "threads": t, "streamed": streamed, "gflops": g})  # fmt: skip
    return out


# --- the phases for real -----------------------------------------------------------------------------------


def build_config(model_dir: str, data_dir: Path, extra: list[str]) -> Any:
    """The preset's config pointed at ``model_dir`` and a data folder of its own (generated from the
    preset's ``data.synthetic`` spec on first read)."""
    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.presets import get_preset

    sets = [f"model.path={model_dir}", f"data.path={data_dir}", *extra]
    return parse_config(apply_overrides(get_preset(PRESET), sets))


def train_plan(trainer: Any, samples: list[Any]) -> list[list[tuple[int, int]]]:
    """The (prompt, response) lengths of each micro-batch the trainer's next step runs: its shuffled
    order (drawn from a copy of its generator) cut by ``plan_rows`` at its token budget and in its
    ``trainer.micro_batch_order``."""
    import torch

    from rl_engine.trainer.microbatch import plan_rows

    tc = trainer.cfg.trainer
    gen = torch.Generator().manual_seed(0)
    gen.set_state(trainer.generator.get_state())
    lens = [(len(s.prompt_ids), len(s.response_ids)) for s in samples]
    plan = []
    for _ in range(tc.ppo_epochs):
        order = torch.randperm(tc.batch_size, generator=gen).tolist()
        for start in range(0, tc.batch_size, tc.mini_batch_size):
            idx = order[start : start + tc.mini_batch_size]
            rows = tc.micro_batch_size or len(idx)
            groups = plan_rows([lens[i][0] for i in idx], [lens[i][1] for i in idx], rows,
                               trainer.max_tokens, tc.micro_batch_order)  # fmt: skip
            plan += [[lens[idx[j]] for j in g] for g in groups]
    return plan


def logprob_plan(trainer: Any, samples: list[Any]) -> list[list[tuple[int, int]]]:
    """The micro-batches of a log-prob forward: the batch's rows cut by ``plan_rows`` as the trainer
    cuts them."""
    from rl_engine.trainer.microbatch import plan_rows

    tc = trainer.cfg.trainer
    lens = [(len(s.prompt_ids), len(s.response_ids)) for s in samples]
    rows = tc.micro_batch_size or len(lens)
    groups = plan_rows(
        [p for p, _ in lens], [r for _, r in lens], rows, trainer.max_tokens, tc.micro_batch_order
    )
    return [[lens[j] for j in g] for g in groups]


def _timed(fn: Any, repeats: int) -> tuple[float, Any]:
    """(median seconds of ``repeats`` calls after one warm-up call, the last call's result)."""
    result = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def generate(cfg: Any, prompts_count: int, repeats: int) -> tuple[float, list[Any]]:
    """(median seconds, the samples) of the HF rollout worker generating one step's batch of the
    preset's prompts; each sample gets a 0/1 reward (what the advantages need: not a phase here)."""
    import random

    from rl_engine.backends import build_rollout_worker
    from rl_engine.data import PromptStream

    worker = build_rollout_worker(cfg)
    prompts = PromptStream(cfg, worker.tokenizer).next_batch(prompts_count)
    gen_s, samples = _timed(lambda: worker.generate(prompts, cfg.rollout.n), repeats)
    rng = random.Random(0)
    return gen_s, [replace(s, reward=float(rng.random() < 0.5)) for s in samples]


def train(cfg: Any, samples: list[Any], repeats: int) -> dict[str, Any]:
    """The trainer's log-prob forward and its step on ``samples``, timed (medians), with their plans."""
    import torch

    from rl_engine.trainer import PolicyTrainer

    trainer = PolicyTrainer(cfg)
    torch.set_num_threads(cfg.trainer.num_threads)
    lp_s, _ = _timed(lambda: trainer.compute_logprobs(samples), repeats)
    trainer.train_step(samples)  # warm-up: allocates the AdamW state
    times, plan = [], []
    for _ in range(repeats):
        plan = train_plan(trainer, samples)  # this step's micro-batches
        t0 = time.perf_counter()
        trainer.train_step(samples)
        times.append(time.perf_counter() - t0)
    return {"logprob_s": lp_s, "train_s": statistics.median(times), "train_plan": plan,
            "logprob_plan": logprob_plan(trainer, samples)}  # fmt: skip


def phase_figures(work: Work, seconds: float, peak: float, own: float) -> dict[str, Any]:
    """A phase's FLOPs (GFLOP), achieved GFLOP/s and fractions of the bound (``peak``: the best fp32
    matmul here; ``own``: the fp32 matmul at the phase's rows and the MLP's width)."""
    achieved = work.total / seconds / 1e9
    return {
        "seconds": seconds,
        "gflop": {
            "real": work.real / 1e9,
            "padding": work.padding / 1e9,
            "recompute": work.recompute / 1e9,
            "total": work.total / 1e9,
        },
        "padding_share": work.padding / work.total,
        "recompute_share": work.recompute / work.total,
        "achieved_gflops": achieved,
        "useful_gflops": work.real / seconds / 1e9,
        "fraction_of_peak": achieved / peak,
        "fraction_of_own_shape": achieved / own,
    }


def report(shape: Shape, runs: dict[str, Any], matmuls: list[dict], threads: int) -> dict[str, Any]:
    """Each phase's work and fractions of the float32 bound at ``threads`` (``phase_figures``)."""
    fp32 = [m for m in matmuls if m["dtype"] == "float32" and m["threads"] == threads]
    peak = max(m["gflops"] for m in fp32)

    def own(rows_of: str, streamed: bool = False) -> float:
        return next(m["gflops"] for m in fp32 if m["rows_of"] == rows_of and m["width"] == "mlp"
                    and m["streamed"] == streamed)  # fmt: skip

    samples, mb = runs["samples"], runs["gen_micro_batch"]
    gen = {"prefill": Work(0.0), "decode": Work(0.0)}
    for start in range(0, len(samples), mb):
        chunk = samples[start : start + mb]
        for k, w in count_generation(shape, [len(s.prompt_ids) for s in chunk],
                                     [len(s.response_ids) for s in chunk]).items():  # fmt: skip
            gen[k] = gen[k] + w
    out: dict[str, Any] = {
        "prefill": phase_figures(gen["prefill"], runs["prefill_s"], peak, own("prefill")),
        "decode": phase_figures(gen["decode"], runs["generation_s"] - runs["prefill_s"], peak, own("decode")),
        "generation": phase_figures(
            gen["prefill"] + gen["decode"], runs["generation_s"], peak, own("decode")
        ),
    }
    out["decode"]["fraction_of_streamed_shape"] = out["decode"]["achieved_gflops"] / own("decode", True)
    for order, t in runs["train"].items():
        train = count_train(shape, t["train_plan"])
        out[f"logprob_forward[{order}]"] = phase_figures(count_logprob_forward(shape, t["logprob_plan"]),
                                                         t["logprob_s"], peak, own("train"))  # fmt: skip
        out[f"train_step[{order}]"] = phase_figures(train["train_forward"] + train["train_backward"],
                                                    t["train_s"], peak, own("train"))  # fmt: skip
        out[f"train_step[{order}]"]["micro_batch_rows"] = [len(m) for m in t["train_plan"]]
    out["bound_fp32_gflops"] = {"peak": peak, "threads": threads}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, one repeat: a check that it runs")
    ap.add_argument("--repeats", type=int, default=2, help="timed calls per phase after a warm-up")
    ap.add_argument("--out", default=None, help="write the JSON report here too")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench_step_bound_"))
    try:
        extra = ["rollout.num_threads=1", "trainer.num_threads=1"]
        prompts_count, min_time_s, model_dir = 4, 0.3, args.model
        if args.smoke:  # the full run's code paths at tiny sizes: figures mean nothing
            from real_model import smoke_model

            model_dir = str(smoke_model(tmp))
            extra += ["data.synthetic.train_size=16", "data.synthetic.test_size=4", "rollout.max_new_tokens=8",
                      "trainer.batch_size=16", "trainer.mini_batch_size=16", "rollout.micro_batch_size=16"]  # fmt: skip
            prompts_count, min_time_s, args.repeats = 2, 0.02, 1
        elif not (Path(model_dir) / "config.json").exists():
            sys.exit(f"{model_dir}: no model there (make model fetches SmolLM2-135M-Instruct)")
        load_before = os.getloadavg()
        cfg = build_config(model_dir, tmp / "data", extra)
        from transformers import AutoConfig

        shape = Shape.of(AutoConfig.from_pretrained(model_dir))
        t0 = time.perf_counter()
        prefill_s, _ = generate(build_config(model_dir, tmp / "data", [*extra, "rollout.max_new_tokens=1"]),
                                prompts_count, args.repeats)  # fmt: skip
        generation_s, samples = generate(cfg, prompts_count, args.repeats)
        runs: dict[str, Any] = {"samples": samples, "prefill_s": prefill_s, "generation_s": generation_s,
                                "gen_micro_batch": min(cfg.rollout.micro_batch_size, len(samples)), "train": {}}  # fmt: skip
        for order in ("shuffled", "length"):  # before and after length-sorted micro-batches
            runs["train"][order] = train(
                build_config(model_dir, tmp / "data", [*extra, f"trainer.micro_batch_order={order}"]),
                samples,
                args.repeats,
            )
        phases_s = time.perf_counter() - t0
        plans = [mb for t in runs["train"].values() for mb in t["train_plan"]]
        rows = {
            "decode": runs["gen_micro_batch"],
            "prefill": runs["gen_micro_batch"] * max(len(s.prompt_ids) for s in samples),
            "train": max(len(mb) * max(p + r for p, r in mb) for mb in plans),
        }
        matmuls = bench_matmuls(shape, rows, [1, 2], min_time_s)
        result = {
            "model": model_dir if not args.smoke else "smoke",
            "shape": asdict(shape) | {"body_params": shape.body_params, "head_params": shape.head_params},
            "cpu": cpu_features(),
            "batch": {
                "samples": len(samples),
                "prompt_tokens": [len(s.prompt_ids) for s in samples],
                "response_tokens": [len(s.response_ids) for s in samples],
            },
            "threads": 1,
            "phases": report(shape, runs, matmuls, 1),
            "matmul": matmuls,
            "phases_wall_s": phases_s,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text)
    print("\nphase                        s    GFLOP  padding  recompute  GFLOP/s  of peak  of own shape")
    for name, r in result["phases"].items():
        if name == "bound_fp32_gflops":
            continue
        print(f"{name:24} {r['seconds']:7.2f} {r['gflop']['total']:8.1f}  {r['padding_share']:7.1%}  "
              f"{r['recompute_share']:9.1%}  {r['achieved_gflops']:7.1f}  {r['fraction_of_peak']:7.1%}  "
              f"{r['fraction_of_own_shape']:7.1%}")  # fmt: skip


if __name__ == "__main__":
    main()

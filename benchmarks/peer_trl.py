"""Against the peer: TRL's ``GRPOTrainer`` (trl 1.16.0) and the engine on the same work, one after the other.

The work is the ``smollm2-arith-cpu`` preset's: its model folder, its train and held-out data (generated
once from the preset's ``data.synthetic`` spec into ``OUT/data`` and read by every run), its reward
(``math_verify`` on the final number), group size 8, 32 samples a step, 64 new tokens, temperature 0.7,
lr 2e-5 constant, no KL. The runs, each in its own process, one after the other, same seeds:

- ``trl:grpo:SEED``: ``trl.GRPOTrainer`` on CPU (public API only: ``GRPOConfig``, a reward function, a
  ``transformers.TrainerCallback``), configured from the same parsed config the engine runs get;
- ``hf:sync:SEED``, ``hf:fully_async:SEED``, ``vllm:fully_async:SEED``: ``python -m rl_engine train
  --config preset:smollm2-arith-cpu`` launched exactly as ``benchmarks/real_model.py`` launches them (its
  ``run_learning``); the vLLM run only where vLLM's CPU environment exists, else skipped with the reason.

**One evaluation for both.** Held-out pass@1 comes from the engine's ``rl_engine.evaluation.Evaluator``
with the HF rollout worker, greedy, every held-out prompt (128), before training, every ``eval.every``
steps (10) and at the end, for both sides. The engine runs it inside its pipeline (rollouter 0); for TRL
a ``TrainerCallback`` copies the trainer's current parameters into an HF rollout worker
(``update_weights``) and runs the same ``Evaluator`` on it, built from the same config. The report holds a
fingerprint of the held-out prompts each side's evaluator reads (their uids, token ids and answers) and
the number each engine evaluation reported (``val/num_prompts``): ``same_eval_prompts`` says they agree.

**Wall clock.** Both from the start of training, model loading excluded (the engine: its "pipeline
running" event, Ray start-up excluded; TRL: ``on_train_begin``). The engine's includes its evaluations
(they run inside the pipeline, beside generation in fully_async); **TRL's excludes them**: the callback's
evaluation time (the weight copy and the generation) is taken off TRL's clock and reported on its own
(``eval_s``), so TRL is not charged for an evaluation it would not run itself. Step times: TRL's from
``on_step_begin`` to ``on_step_end`` (generation, reward, loss, backward, AdamW); the engine's
``timing/step_s``.

**Same prompts, same order.** TRL's training set is the engine's prompt stream itself (``PromptStream``
of the same config and seed: the train split in its seeded per-epoch order), the first ``steps x 4``
prompts, with ``shuffle_dataset=False``: TRL's step k trains on the prompts the engine's sync step k
does. Each is given as a conversation (the user turn, as the engine's renderer builds it) and TRL applies
the tokenizer's chat template with the generation prompt itself; the report's ``prompt_tokens_equal``
checks that this gives the engine's prompt tokens for every training prompt. Both use the tokenizer the
engine loads (``rl_engine.models.load_tokenizer``: left padding, a pad token), passed as
``processing_class``.

**TRL defaults changed to match the engine** (``trl_settings`` in the report lists each with TRL's
default, the value here and why):

- ``loss_type="dapo"`` (TRL's default too): the per-token loss summed over every completion token of
  the batch and divided by their number, the engine's ``token_mean``;
- ``beta=0.0`` (TRL's default too): no KL, no reference model;
- ``epsilon=0.2``, ``epsilon_high=0.28`` (TRL: 0.2 and 0.2): the engine's clip range (clip-higher);
- ``scale_rewards="group"`` (TRL's default): the engine's ``norm_adv_by_std``;
- ``mask_truncated_completions=False`` (TRL's default): the engine keeps truncated answers (scored 0);
- ``num_iterations=1`` (TRL's default), ``gradient_accumulation_steps=1``,
  ``per_device_train_batch_size=32``, ``num_generations=8``: one AdamW update per 32 samples, the engine's
  ``ppo_epochs 1`` and ``mini_batch_size = batch_size``;
- ``max_completion_length=64`` (TRL: 512), ``temperature=0.7`` (TRL: 1.0), ``learning_rate=2e-5``
  (TRL: 1e-6), ``lr_scheduler_type="constant"`` (TRL: linear decay to 0), ``max_grad_norm``, AdamW's
  betas and weight decay from the config (TRL's defaults are the same: 1.0, (0.9, 0.999), 0);
- ``bf16=False`` (TRL: True, bf16 autocast) and ``gradient_checkpointing=False`` (TRL: True): the engine
  trains in float32 without checkpointing (``trainer.precision auto`` on a float32 model);
- ``shuffle_dataset=False`` (TRL: True): see above; ``seed`` = the run's seed;
- ``use_cpu=True``, ``logging_steps=1``, ``save_strategy="no"``, ``report_to="none"``.

**What still differs** (read from trl/trainer/grpo_trainer.py and grpo_config.py, 1.16.0):

- *Old log-probs*: TRL, on-policy (``num_iterations=1``), takes the loss forward's own log-probs,
  detached, as the old ones (ratio 1, no clipping ever active); the engine takes the rollout's behaviour
  log-probs (equal to float precision in sync; one step stale at most in fully_async, where the clip
  range and the engine's dual clip, c = 3, act). TRL has no dual clip (its ``delta`` is a different cap).
- *Advantages*: both (r - mean) / (std + eps) within a group with the unbiased std; eps 1e-4 (TRL)
  against 1e-6 (engine).
- *Generation*: TRL calls ``model.generate`` once on the whole batch (32 sequences, prompts left-padded,
  KV cache; finished rows keep decoding pads until the longest is done), in the training process, between
  steps; the engine's HF worker decodes the batch in its own KV-cache loop (finished rows dropped) in its
  own process, overlapped with the trainer's step in fully_async; vLLM's CPU build batches continuously.
- *Padding and positions*: TRL's loss forward is [left-padded prompt | right-padded completion] with the
  model's default positions (shifted by each row's padding: RoPE sees the same relative positions); the
  engine uses one layout for rollout and trainer with positions from the attention mask
  (``rl_engine.models.batching``) and splits a mini-batch into micro-batches by a token budget.
- *Extra work in TRL's step*: the loss forward also computes every completion token's entropy (a metric).
- *Chat template*: identical tokens (checked), applied by TRL at each step from the conversation.
- *Threads*: TRL runs in one process with torch's default threads (all cores: 2 here; ``--trl-threads``);
  the engine's preset gives its trainer and its rollouter one thread each, in separate processes.
- *Reward call*: TRL calls the reward in its main thread, where math-verify's signal timeout is on; the
  engine's rollouter scores in a worker thread (timeout off). Same scores, except a parse that times out.

    .venv/bin/python benchmarks/peer_trl.py --smoke          # a tiny model, 2 steps of TRL and of the engine (CI)
    .venv/bin/python benchmarks/peer_trl.py --quick          # SmolLM2, 2 steps, 16 held-out prompts
    .venv/bin/python benchmarks/peer_trl.py --runs trl:grpo:0,hf:sync:0,hf:fully_async:0,vllm:fully_async:0 \\
        --steps 40 --out var/bench/peer-trl                  # the figures in docs/benchmarks.md
    # --reuse reads the runs an earlier invocation finished in --out: add runs (and seeds) one at a time

Needs the model (``make model``) and ``trl==1.16.0`` (requirements-dev.txt).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.real_model import (  # noqa: E402 - after the path set-up, as real_model's own imports
    MODEL_NAME,
    PRESET,
    RUN_TIMEOUT_S,
    Curve,
    RunSpec,
    extra_set_scores,
    plot,
    run_learning,
    run_overrides,
    smoke_model,
    vllm_missing,
)

TRL_VERSION = "1.16.0"
PEER = "trl"  # the backend name of a TRL run in --runs (trl:grpo:SEED)
DEFAULT_RUNS = "trl:grpo:0,hf:sync:0,hf:fully_async:0,vllm:fully_async:0"


# --- the config both sides read ----------------------------------------------------------------------------


def experiment_config(args: argparse.Namespace, spec: RunSpec) -> Any:
    """The parsed config of run ``spec``: the preset with real_model's overrides for it (what the engine
    run is given on its command line; a TRL run reads the sync one's)."""
    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.presets import get_preset

    engine_spec = spec if spec.backend != PEER else RunSpec("hf", "sync", spec.seed)
    sets = run_overrides(args, engine_spec, Path(args.out) / "data")
    return parse_config(apply_overrides(get_preset(args.preset), sets))


def prompts_fingerprint(prompts: list[Any]) -> str:
    """sha256 of the prompts' uids, token ids and reference answers, in order."""
    doc = [[p.uid, list(p.token_ids), p.answer] for p in prompts]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


def eval_prompts_of(cfg: Any) -> list[Any]:
    """The held-out prompts an ``Evaluator`` built from ``cfg`` reads (``Evaluator.from_config``'s call)."""
    from rl_engine.data import validation_prompts
    from rl_engine.models import load_tokenizer

    return validation_prompts(cfg, load_tokenizer(cfg.model), cfg.eval.max_prompts)


# --- the peer: TRL's GRPOTrainer (runs in its own process: --inner trl) ---------------------------------------


class _RecordedRows:
    """A row source that remembers the last row the prompt stream read (to hand TRL the same rows)."""

    def __init__(self, rows: Any) -> None:
        self._rows = rows
        self.last: Any = None

    def __len__(self) -> int:
        return len(self._rows)

    def row(self, j: int) -> Any:
        self.last = self._rows.row(j)
        return self.last


def train_examples(cfg: Any, tokenizer: Any, count: int) -> tuple[list[dict[str, Any]], bool]:
    """The engine's first ``count`` training prompts as TRL examples (``prompt``: the conversation, or the
    rendered text without a chat template; ``answer``), and whether TRL's rendering of each (the chat
    template with the generation prompt) gives the engine's prompt tokens."""
    from rl_engine.data import PromptStream, train_rows

    rows = _RecordedRows(train_rows(cfg))
    stream = PromptStream(cfg, tokenizer, rows=rows)
    examples, equal = [], True
    for _ in range(count):
        [prompt] = stream.next_batch(1)  # the recorded row is the one this prompt came from
        if stream.renderer.use_chat:
            messages = stream.renderer.messages(rows.last)
            ids = tokenizer.apply_chat_template(
                [messages], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"][0]
            examples.append({"prompt": messages, "answer": prompt.answer})
        else:
            ids = tokenizer(text=[prompt.text])["input_ids"][0]  # TRL's call for a plain-text prompt
            examples.append({"prompt": prompt.text, "answer": prompt.answer})
        equal = equal and list(ids) == list(prompt.token_ids)
    return examples, equal


def completion_text(completion: Any) -> str:
    """A TRL completion's text: the assistant turn's content, or the string itself."""
    return completion[-1]["content"] if isinstance(completion, list) else str(completion)


def answer_sample(text: str, answer: str) -> Any:
    """A ``Sample`` holding what a reward reads: the response's text and the reference answer."""
    from rl_engine.types import Sample

    return Sample(prompt_uid="trl", group_id="trl", prompt_ids=[], response_ids=[], logprobs=[],
                  finish_reason="stop", param_version_start=0, param_version_end=0, response_text=text,
                  answer=answer)  # fmt: skip


def trl_reward(cfg: Any) -> Callable[..., list[float]]:
    """The run's reward (``rl_engine.rewards``, here math_verify) as a TRL reward function."""
    from rl_engine.rewards import build_reward
    from rl_engine.rewards.base import score_samples

    reward_fn = build_reward(cfg.reward)

    def math_verify(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        samples = [answer_sample(completion_text(c), a) for c, a in zip(completions, answer, strict=True)]
        score_samples(reward_fn, samples)
        return [s.reward for s in samples]

    return math_verify


# Why each GRPOConfig field is set as it is (the report puts TRL's default beside each).
WHY: dict[str, str] = {
    "per_device_train_batch_size": "samples (completions) per step: trainer.batch_size",
    "num_generations": "group size: rollout.n",
    "max_completion_length": "rollout.max_new_tokens",
    "temperature": "rollout.temperature",
    "learning_rate": "trainer.lr",
    "lr_scheduler_type": "trainer.lr_schedule constant (TRL: linear decay to 0)",
    "epsilon": "algorithm.clip_eps_low",
    "epsilon_high": "algorithm.clip_eps_high (clip-higher; TRL: epsilon)",
    "beta": "algorithm.kl_coef (no KL)",
    "loss_type": "token_mean: every completion token of the batch weighs the same",
    "scale_rewards": "algorithm.norm_adv_by_std",
    "mask_truncated_completions": "the engine trains on truncated answers (scored 0)",
    "num_iterations": "trainer.ppo_epochs",
    "gradient_accumulation_steps": "one AdamW update per step (mini_batch_size = batch_size)",
    "max_grad_norm": "trainer.grad_clip",
    "weight_decay": "trainer.weight_decay",
    "adam_beta1": "trainer.betas[0]",
    "adam_beta2": "trainer.betas[1]",
    "bf16": "the engine trains in float32 (trainer.precision auto, model.dtype float32); TRL's None is "
    "True (bf16 autocast) unless fp16 is set",
    "gradient_checkpointing": "model.gradient_checkpointing (off)",
    "shuffle_dataset": "the training set is the engine's prompt stream, already in its seeded order",
    "seed": "the run's seed",
    "max_steps": "--steps",
    "top_p": "rollout.top_p",
    "warmup_steps": "trainer.warmup_steps",
    "use_cpu": "CPU only",
    "logging_steps": "a reward and length per step for the report",
    "save_strategy": "no checkpoints (the engine's runs write theirs)",
    "report_to": "no tracker",
    "disable_tqdm": "no progress bar in the log",
    "model_init_kwargs": "model.dtype",
    "output_dir": "the run's folder",
}


def grpo_settings(cfg: Any, seed: int, steps: int, out_dir: Path) -> dict[str, Any]:
    """The ``GRPOConfig`` arguments of a TRL run on ``cfg``'s work."""
    tc, ac, rc = cfg.trainer, cfg.algorithm, cfg.rollout
    if (
        tc.mini_batch_size != tc.batch_size
        or ac.kl_coef
        or ac.loss_agg != "token_mean"
        or ac.advantage != "grpo"
    ):
        raise SystemExit(
            "peer_trl compares GRPO, one update per step, token_mean, no KL: the config is not that"
        )
    return {
        "output_dir": str(out_dir), "seed": seed, "max_steps": steps, "use_cpu": True,
        "per_device_train_batch_size": tc.batch_size, "gradient_accumulation_steps": 1,
        "num_generations": rc.n, "max_completion_length": rc.max_new_tokens, "temperature": rc.temperature,
        "top_p": rc.top_p, "learning_rate": tc.lr, "lr_scheduler_type": "constant", "warmup_steps": tc.warmup_steps,
        "weight_decay": tc.weight_decay, "adam_beta1": tc.betas[0], "adam_beta2": tc.betas[1],
        "max_grad_norm": tc.grad_clip or 0.0, "beta": ac.kl_coef, "loss_type": "dapo",
        "epsilon": ac.clip_eps_low, "epsilon_high": ac.clip_eps_high,
        "scale_rewards": "group" if ac.norm_adv_by_std else "none", "mask_truncated_completions": False,
        "num_iterations": tc.ppo_epochs, "bf16": False, "gradient_checkpointing": cfg.model.gradient_checkpointing,
        "model_init_kwargs": {"dtype": cfg.model.dtype}, "shuffle_dataset": False, "logging_steps": 1,
        "save_strategy": "no", "report_to": "none", "disable_tqdm": True,
    }  # fmt: skip


def settings_report(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each setting with TRL's default for it (``GRPOConfig``'s dataclass field) and why it was set."""
    from trl import GRPOConfig

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    out = {}
    for name, value in settings.items():
        default = defaults.get(name, dataclasses.MISSING)
        default = None if default is dataclasses.MISSING else default
        out[name] = {"value": value, "trl_default": default, "why": WHY.get(name, "")}
    return out


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class HeldOutCallback(TrainerCallback):
    """Evaluates TRL's policy with the engine's ``Evaluator`` (before training, every ``eval.every`` steps,
    at the end) and records each step's time, reward and length; evaluation time is off the clock."""

    def __init__(self, cfg: Any, worker: Any, evaluator: Any, steps: int) -> None:
        self.eval_cfg, self.worker, self.evaluator, self.total = cfg.eval, worker, evaluator, steps
        self.eval_threads = cfg.rollout.num_threads  # the engine's rollouter evaluates with these
        self.t0 = 0.0
        self.began = 0.0  # time.time() at on_train_begin (the parent's start-up figure)
        self.eval_s = 0.0
        self.step_t0 = 0.0
        self.steps: list[dict[str, float]] = []
        self.evals: list[dict[str, float]] = []

    def clock(self) -> float:
        """Seconds of training so far: since on_train_begin, evaluations excluded."""
        return time.monotonic() - self.t0 - self.eval_s

    def evaluate(self, model: Any, step: int) -> None:
        t = time.monotonic()
        with torch_threads(self.eval_threads):
            self.worker.update_weights({n: p.detach() for n, p in model.named_parameters()}, step)
            s = self.evaluator.run(self.worker).summary
        took = time.monotonic() - t
        self.eval_s += took
        self.evals.append({"step": step, "wall_s": self.clock(), "pass_at_1": s.pass_at_1,
                           "length": s.response_length, "truncated": s.truncated_ratio, "eval_s": took,
                           "num_prompts": s.num_prompts, **extra_set_scores(s.metrics())})  # fmt: skip
        print(f"  trl eval at step {step}: pass@1 {s.pass_at_1:.3f} ({took:.1f} s)", flush=True)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.t0, self.began = time.monotonic(), time.time()
        if self.eval_cfg.before_training:
            self.evaluate(kwargs["model"], 0)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step_t0 = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        self.steps.append({"step": step, "wall_s": self.clock(), "step_s": time.monotonic() - self.step_t0,
                           "reward": 0.0, "length": 0.0})  # fmt: skip
        every = self.eval_cfg.every
        if (every and step % every == 0) or (step == self.total and self.eval_cfg.at_end):
            self.evaluate(kwargs["model"], step)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
    ) -> None:
        if logs and "reward" in logs and self.steps and self.steps[-1]["step"] == state.global_step:
            self.steps[-1]["reward"] = float(logs["reward"])
            self.steps[-1]["length"] = float(logs.get("completions/mean_length") or 0.0)


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    """One TRL run (this process): its curve, settings and checks, as the parent's JSON."""
    import datasets
    import torch
    import transformers
    import trl
    from trl import GRPOConfig, GRPOTrainer

    from rl_engine.backends import build_rollout_worker
    from rl_engine.evaluation import Evaluator

    if trl.__version__ != TRL_VERSION:
        raise SystemExit(f"trl {trl.__version__}: this comparison is set up against trl {TRL_VERSION}")
    threads = args.trl_threads or torch.get_num_threads()
    spec = RunSpec(PEER, "grpo", args.seed)
    cfg = experiment_config(args, spec)
    worker = build_rollout_worker(cfg)  # the evaluation's HF worker (sets its own thread count)
    torch.set_num_threads(threads)
    evaluator = Evaluator.from_config(cfg, worker.tokenizer)
    if evaluator is None:
        raise SystemExit("the config has no evaluation")
    prompts_per_step = cfg.trainer.batch_size // cfg.rollout.n
    examples, tokens_equal = train_examples(cfg, worker.tokenizer, args.steps * prompts_per_step)
    run_dir = Path(args.out) / "runs" / spec.label
    settings = grpo_settings(cfg, args.seed, args.steps, run_dir / "trl-output")
    callback = HeldOutCallback(cfg, worker, evaluator, args.steps)
    trainer = GRPOTrainer(
        model=str(cfg.model.path),
        reward_funcs=trl_reward(cfg),
        args=GRPOConfig(**settings),
        train_dataset=datasets.Dataset.from_list(examples),
        processing_class=worker.tokenizer,
        callbacks=[callback],
    )
    trainer.train()
    curve = Curve(spec.label, PEER, "grpo", args.seed, steps=callback.steps, evals=callback.evals)
    return {
        "curve": asdict(curve),
        "settings": settings_report(settings),
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "threads": threads,
        "train_began": callback.began,
        "eval_s": callback.eval_s,
        "prompt_tokens_equal": tokens_equal,
        "train_prompts": len(examples),
        "eval_prompts": {
            "count": len(evaluator.prompts),
            "fingerprint": prompts_fingerprint(evaluator.prompts),
        },
    }


def launch_trl(args: argparse.Namespace, spec: RunSpec) -> dict[str, Any]:
    """A TRL run in its own process (``--inner trl``), its log in the run's folder; its result, or the
    error."""
    run_dir = Path(args.out) / "runs" / spec.label
    result_path = run_dir / "result.json"
    if args.reuse and result_path.exists():
        return json.loads(result_path.read_text())
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    print(f"run {spec.label}: {args.steps} steps", flush=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--inner", "trl", "--seed", str(spec.seed),
           "--out", str(args.out), "--model", str(args.model), "--preset", args.preset, "--steps", str(args.steps),
           "--trl-threads", str(args.trl_threads), "--result", str(result_path)]  # fmt: skip
    for s in args.set:
        cmd += ["--set", s]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    started = time.time()
    with (run_dir / "trl.log").open("w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=RUN_TIMEOUT_S, check=False)  # fmt: skip
    if proc.returncode != 0:
        tail = (run_dir / "trl.log").read_text().strip().splitlines()[-1:]
        error = f"exit {proc.returncode}: {tail[0] if tail else ''}"
        return {"curve": asdict(Curve(spec.label, PEER, "grpo", spec.seed, error=error))}
    result = json.loads(result_path.read_text())
    result["curve"]["startup_s"] = result.pop("train_began") - started  # process start -> training
    result_path.write_text(json.dumps(result))
    return result


# --- the engine's runs, and the report --------------------------------------------------------------------


def engine_eval_counts(run_dir: Path) -> list[int]:
    """``val/num_prompts`` of each evaluation an engine run logged."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    counts = []
    for line in path.read_text().splitlines():
        item = json.loads(line)
        if item["type"] == "metrics" and "val/num_prompts" in item["metrics"]:
            counts.append(int(item["metrics"]["val/num_prompts"]))
    return counts


def run_engine(args: argparse.Namespace, spec: RunSpec) -> tuple[Curve, dict[str, Any]]:
    """One engine run (real_model's launch) and what its evaluations read."""
    prompts = eval_prompts_of(experiment_config(args, spec))
    [curve] = run_learning(args, [spec], Path(args.out))
    counts = engine_eval_counts(Path(args.out) / "runs" / spec.label)
    return curve, {"count": len(prompts), "fingerprint": prompts_fingerprint(prompts), "reported": counts}


def time_to(curve: Curve, score: float) -> float | None:
    """Minutes to the first evaluation at or above ``score``."""
    return next((e["wall_s"] / 60 for e in curve.evals if e["pass_at_1"] >= score), None)


def against_peer(curves: list[Curve]) -> list[dict[str, Any]]:
    """Per engine run with a TRL run of its seed: time to TRL's best held-out pass@1 against TRL's, and
    the score at TRL's last evaluation's wall clock against TRL's final one."""
    peers = {c.seed: c for c in curves if c.backend == PEER and c.evals and c.error is None}
    out = []
    for c in curves:
        peer = peers.get(c.seed)
        if c.backend == PEER or peer is None or not c.evals:
            continue
        best = max(e["pass_at_1"] for e in peer.evals)
        peer_min, ours_min = time_to(peer, best), time_to(c, best)
        end_min = peer.evals[-1]["wall_s"] / 60
        out.append({"run": c.label, "peer": peer.label, "peer_best": best, "peer_min_to_best": peer_min,
                    "min_to_peer_best": ours_min,
                    "ratio_to_peer_best": None if ours_min is None or not peer_min else ours_min / peer_min,
                    "peer_final": peer.evals[-1]["pass_at_1"], "at_peer_final_min": c.pass_at(end_min)})  # fmt: skip
    return out


def median_step(curve: Curve) -> float | None:
    step_s = [s["step_s"] for s in curve.steps if s.get("step_s")]
    return statistics.median(step_s) if step_s else None


def run_all_specs(args: argparse.Namespace, specs: list[RunSpec]) -> dict[str, Any]:
    """Every run of ``specs`` in order; the report's runs part."""
    curves: list[Curve] = []
    runs: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for spec in specs:
        if spec.backend == "vllm" and (why := vllm_missing()):
            print(f"skip {spec.label}: {why}", flush=True)
            skipped.append({"run": spec.label, "why": why})
            continue
        if spec.backend == PEER:
            result = launch_trl(args, spec)
            curve = Curve(**result["curve"])
            extra = {k: v for k, v in result.items() if k != "curve"}
        else:
            curve, eval_prompts = run_engine(args, spec)
            extra = {"eval_prompts": eval_prompts}
        curves.append(curve)
        runs.append({**curve.summary(args.minutes), "median_step_s_all": median_step(curve), **extra})
        print(f"  {spec.label}: {curve.error or 'ok'}; median step {median_step(curve)}", flush=True)
    return {"curves": curves, "runs": runs, "skipped": skipped}


def same_eval_prompts(runs: list[dict[str, Any]]) -> bool:
    """Every run's evaluator read the same held-out prompts, and every engine evaluation reported them all."""
    prints = {r["eval_prompts"]["fingerprint"] for r in runs if "eval_prompts" in r}
    counts_ok = all(
        all(n == r["eval_prompts"]["count"] for n in r["eval_prompts"].get("reported", [])) for r in runs
    )
    return len(prints) == 1 and counts_ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=DEFAULT_RUNS, help="backend:mode:seed, comma-separated (trl:grpo:SEED)")
    p.add_argument("--steps", type=int, default=40, help="trainer steps per run")
    p.add_argument("--minutes", type=float, default=40.0, help="report pass@1 at this wall clock")
    p.add_argument("--set", action="append", default=[], help="a config override for every run (repeatable)")
    p.add_argument("--preset", default=PRESET)
    p.add_argument(
        "--model", default=None, help=f"model directory (default: the first model root's {MODEL_NAME})"
    )
    p.add_argument("--out", default=None, help="folder for runs, JSON and PNG (default: a temporary one)")
    p.add_argument("--reuse", action="store_true", help="read runs an earlier invocation finished in --out")
    p.add_argument(
        "--trl-threads", type=int, default=0, help="torch threads of the TRL run (0: torch's default)"
    )
    p.add_argument(
        "--quick", action="store_true", help="SmolLM2, 2 steps, 16 held-out prompts, TRL and hf runs"
    )
    p.add_argument("--smoke", action="store_true", help="a tiny model, 2 steps of TRL and of one engine run")
    p.add_argument("--inner", choices=["trl"], help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.extend = False  # real_model's run_learning reads it: a run here always runs from step 0

    if args.inner:
        Path(args.result).write_text(json.dumps(run_trl(args)))
        return 0

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="peer_trl_"))
    out.mkdir(parents=True, exist_ok=True)
    args.out = out
    specs = [RunSpec.parse(r) for r in args.runs.split(",") if r]
    if args.smoke:
        args.model = str(smoke_model(out))
        args.preset = "gsm8k-style-tiny-cpu"
        args.steps = 2
        args.set = ["data.synthetic.train_size=64", "data.synthetic.test_size=8", "trainer.batch_size=16",
                    "trainer.mini_batch_size=16", "eval.every=1", *args.set]  # fmt: skip
        specs = [RunSpec(PEER, "grpo", 0), RunSpec("hf", "fully_async", 0)]
    elif args.quick:
        args.steps = 2
        args.set = ["eval.every=2", "eval.max_prompts=16", *args.set]
        specs = [s for s in specs if s.backend in (PEER, "hf")]
    if args.model is None:
        from rl_engine.cli import default_model_root

        args.model = str((default_model_root() / MODEL_NAME).resolve())
    if not (Path(args.model) / "config.json").exists():
        print(f"error: no model at {args.model}: make model (or --model DIR)", file=sys.stderr)
        return 1

    load_before = os.getloadavg()[0]
    done = run_all_specs(args, specs)
    curves: list[Curve] = done["curves"]
    report: dict[str, Any] = {
        "preset": args.preset, "model": args.model, "steps": args.steps, "minutes": args.minutes,
        "overrides": args.set, "cpus": os.cpu_count(), "load_average": [load_before, os.getloadavg()[0]],
        "trl_wall_clock": "training only: TRL's evaluations (the callback's) are off its clock",
        "runs": done["runs"], "skipped": done["skipped"], "same_eval_prompts": same_eval_prompts(done["runs"]),
        "against_peer": against_peer(curves), "curves": [asdict(c) for c in curves],
    }  # fmt: skip
    title = f"TRL GRPOTrainer vs the engine: {Path(args.model).name}, preset {args.preset}, {os.cpu_count()} CPU cores"
    why = plot(curves, out / "curves.png", args.minutes, title)
    report["png"] = None if why else str(out / "curves.png")
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "curves"}, indent=2)[:6000])
    print(f"figures: {out / 'report.json'}")
    failed = [c.label for c in curves if c.error]
    return 1 if failed or not report["same_eval_prompts"] else 0


if __name__ == "__main__":
    sys.exit(main())

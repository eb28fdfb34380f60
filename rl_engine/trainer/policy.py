"""``PolicyTrainer``: one trainer step = advantages -> ppo_epochs x mini-batch AdamW updates -> version + 1.

Log-probs are of logits / ``rollout.temperature`` (the distribution the rollout sampled from), computed
on the shared padding layout of ``rl_engine.models.batching`` so they match the rollout's to float
precision on the same weights.

Scale: the model, its AdamW state, the reference model and every batch tensor live on
``trainer.device``. Parameters and optimizer state are float32 (master weights); ``trainer.precision
bf16`` runs the forward/backward under bf16 autocast. The output layer runs in token chunks
(``rl_engine.models.logprobs``): no ``[tokens, vocab]`` float32 tensor is ever materialised. Each
mini-batch is split into micro-batches by a token budget (``trainer.microbatch``); the loss keeps the
whole mini-batch's normalisers, so the accumulated gradient is the mini-batch gradient.

Old log-probs in the PPO ratio, by ``algorithm.off_policy``:
- ``none``: the behaviour log-probs from the rollout.
- ``tis``: recomputed with the current weights before this step's first update; the per-token loss
  is weighted by min(exp(old - behaviour), tis_threshold) to correct for the rollout being stale.
- ``decoupled``: decoupled PPO as AReaL does it: the proximal log-probs are recomputed with the current
  weights before this step's first update (no second model copy); the behaviour weight
  exp(proximal - behaviour) filters out tokens above tis_threshold instead of truncating them.

Behaviour log-probs that are not finite (an engine returned NaN or -inf) reject their sample: it is
left out of the loss and counted in ``error/nonfinite_behaviour_logprobs``.

Stopping mid-step: ``train_step(samples, stop)`` asks ``stop()`` before every micro-batch (the old /
reference log-prob forwards and the forward/backward passes) until the step's first optimizer update.
When it says yes (on any rank: the answer is a max over the group, so every rank leaves at the same
micro-batch), the step is abandoned with nothing applied and ``StepAborted`` is raised: gradients are
dropped, the step's random state restored, the version and optimizer untouched, so a checkpoint taken
next is the last completed step exactly. From the first update on the step runs to its end.
``stop_timings()`` says how long the longest stretch between two such points and the step's
uninterruptible tail (clip, AdamW, LR step) took: what a graceful stop needs from the trainer.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_engine.algos.advantages import get_advantage_fn, scored_advantages
from rl_engine.algos.losses import OFF_POLICY_WEIGHTS, aggregate, kl_k3, ppo_clip_loss
from rl_engine.config import ExperimentConfig
from rl_engine.config.lora import sync_mode
from rl_engine.models import load_model, load_tokenizer, resolve_device, special_token_ids, torch_dtype
from rl_engine.models.batching import PackedBatch, pack, right_pad
from rl_engine.models.logprobs import default_chunk_tokens
from rl_engine.models.lora import (
    ADAPTER_DIR,
    MergedWeights,
    adapter_parameters,
    add_adapters,
    load_adapters,
    save_adapters,
)
from rl_engine.trainer import checkpoint as ckpt
from rl_engine.trainer.distributed import (
    GatheredParams,
    Ranks,
    full_tensor,
    pad_plans,
    shard,
    split_by_tokens,
)
from rl_engine.trainer.forward import PolicyForward
from rl_engine.trainer.microbatch import (
    MicroBatch,
    ModelShape,
    default_token_budget,
    plan_rows,
    row_lengths,
    select,
)
from rl_engine.trainer.schedule import build_lr_multiplier
from rl_engine.types import Sample, StepAborted
from rl_engine.weights.buckets import LocalWeightStream, StagingBuffer, plan_buckets


def _never() -> bool:
    return False


def resolve_precision(setting: str, model_dtype: str) -> str:
    """``auto`` -> ``bf16`` when the model is served in a 16-bit dtype, else ``fp32``."""
    if setting != "auto":
        return setting
    return "bf16" if model_dtype in ("bfloat16", "float16") else "fp32"


@dataclass
class StepData:
    """The fixed tensors of one trainer step, on the trainer's device. Per-token ones are [B, R]."""

    batch: PackedBatch
    adv: torch.Tensor
    behaviour: torch.Tensor  # non-finite values replaced by 0 (their samples are rejected)
    mask: torch.Tensor  # float response mask with rejected samples zeroed: the loss mask
    old: torch.Tensor
    is_w: torch.Tensor | None  # off-policy weights (tis / decoupled)
    is_flag: torch.Tensor | None  # tokens truncated (tis) or filtered out (decoupled)
    ref: torch.Tensor | None
    rejected: int  # samples with non-finite behaviour log-probs


class PolicyTrainer:
    """The policy and its optimizer; see the module docstring for the update and the contract."""

    def __init__(self, cfg: ExperimentConfig, *, device: str | None = None, ranks: Ranks | None = None):
        self.cfg = cfg
        # this process's rank in the trainer group; more than one rank needs the process group joined
        # first (rl_engine.trainer.distributed.init_group)
        self.ranks = ranks or Ranks()
        tc, ac = cfg.trainer, cfg.algorithm
        torch.set_num_threads(tc.num_threads)
        self.device = torch.device(device or resolve_device(tc.device, cfg.resources.trainer_gpus, "trainer"))
        self.precision = resolve_precision(tc.precision, cfg.model.dtype)
        self.rollout_dtype = torch_dtype(cfg.model)  # what the rollout serves: weights are published in it
        # float32 master weights whatever the rollout serves: AdamW state follows the parameters' dtype,
        # and bf16 state does not learn at small learning rates (updates round away).
        self.model = load_model(
            cfg.model, device=str(self.device), dtype=torch.float32, training=True
        ).train()
        # model.lora: peft adapters on the frozen weights; AdamW, the sync and the checkpoint hold them only
        self.lora = cfg.model.lora is not None
        # what a sync sends with LoRA: the adapters (a worker that applies them) or the merged weights
        self.lora_sync = sync_mode(cfg.model.lora, cfg.rollout.backend)
        if cfg.model.lora is not None:
            self.model = add_adapters(self.model, cfg.model.lora, cfg.seed).train()
        self.tokenizer = load_tokenizer(cfg.model)
        self.pad_id = special_token_ids(cfg.model, self.tokenizer).pad_id  # the rollout pads with the same id
        self.temperature = cfg.rollout.temperature
        vocab = self.model.get_output_embeddings().weight.shape[0]
        self.chunk_tokens = tc.logits_chunk_tokens or default_chunk_tokens(vocab)
        shape = ModelShape.of(self.model.config, vocab, cfg.model.gradient_checkpointing)
        self.max_tokens = tc.max_tokens_per_micro_batch or default_token_budget(shape)
        self.policy = self._wrap(self.model)  # sharded per decoder layer and at the root when world > 1
        self.version = 0
        self.optimizer_steps = 0
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=tc.lr,
            betas=tc.betas,
            weight_decay=tc.weight_decay,
        )
        multiplier, self.total_optimizer_steps = build_lr_multiplier(tc)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, multiplier)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self._advantage_fn = get_advantage_fn(ac.advantage)
        # The only extra model: the frozen initial policy, only when a KL penalty needs it, in the
        # compute dtype (it is never trained), on the same device. With LoRA there is none: the reference
        # is the policy with its adapters disabled (the frozen base weights are the initial policy).
        self.ref_model = self._reference() if ac.kl_coef > 0 and not self.lora else None
        # a weight-sync staging buffer (one bucket), kept between syncs; allocated only when a receiver
        # does not lend its own memory (the object store does not; an in-process HF worker does)
        self._staging = StagingBuffer()
        # stopping mid-step (module docstring): the step's stop question while it may still be abandoned
        self._stop: Callable[[], bool] | None = None
        self._last_point = 0.0
        self._longest_gap_s = 0.0  # the longest stretch between two stop points seen in a step
        self._tail_s = 0.0  # the last step's first optimizer update and what follows it

    def _wrap(self, model: torch.nn.Module) -> PolicyForward:
        fwd = PolicyForward(model, self.temperature, self.chunk_tokens)
        if self.ranks.sharded:
            shard(fwd, model, self.device)
        return fwd

    def _reference(self) -> PolicyForward:
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        m = load_model(self.cfg.model, device=str(self.device), dtype=dtype).eval()
        for p in m.parameters():
            p.requires_grad_(False)
        return self._wrap(m)

    def _synced_parameters(self) -> dict[str, torch.nn.Parameter]:
        """What a weight sync sends: every parameter, or with LoRA the adapters only (the rollout worker
        holds the same frozen base weights and the same adapter names: ``rl_engine.models.lora``)."""
        return adapter_parameters(self.model) if self.lora else dict(self.model.named_parameters())

    # --- contract: weights ---------------------------------------------------------------------------
    def weights_numpy(self) -> dict[str, np.ndarray]:
        """Contiguous float32 CPU copies by parameter name: a whole-model copy, for tests and tools;
        weight syncs use ``weight_stream``."""
        return {
            n: np.ascontiguousarray(full_tensor(p.detach()).float().cpu().numpy()).copy()
            for n, p in self.model.named_parameters()
        }

    def weight_stream(
        self, dtype: torch.dtype | None = None, bucket_bytes: int | None = None, *, split: bool = True
    ) -> LocalWeightStream:
        """The policy's parameters as buckets cast to the rollout dtype (``model.dtype``), one bucket of
        ``trainer.weight_sync_bucket_mb`` at a time (see ``rl_engine.weights.buckets``; ``split=False``:
        whole tensors per bucket, for the GPU engines). With LoRA: the adapters alone, or, with
        ``model.lora.sync`` merged (a backend that does not apply adapters), every weight of the base
        model with the adapters merged in (``MergedWeights``).

        Sharded (world > 1): a parameter of up to one bucket's bytes is gathered whole when the stream
        first reads it and dropped when it reads the next; a larger one (the embedding) is broadcast
        from the ranks holding its rows, a bucket's bytes at a time, straight into the bucket
        (``GatheredParams``): the sending rank holds at most one bucket beyond its shards besides the
        bucket itself. Every rank must iterate the stream, in step (each read is a collective); only
        the sending rank's buckets go anywhere.
        """
        size = bucket_bytes or self.cfg.trainer.weight_sync_bucket_mb * 2**20
        if self.lora_sync == "merged":  # one rank (the config's check): the base names, adapters merged in
            merged = MergedWeights(self.model)
            manifest = plan_buckets(merged.shapes(), dtype or self.rollout_dtype, size, split=split)
            return LocalWeightStream(manifest, merged, self._staging)
        named = self._synced_parameters()
        shapes = ((n, tuple(p.shape)) for n, p in named.items())  # a DTensor's shape is the whole one
        manifest = plan_buckets(shapes, dtype or self.rollout_dtype, size, split=split)
        tensors = (
            GatheredParams(named, self.ranks, whole_max_bytes=size, slice_bytes=size)
            if self.ranks.sharded
            else named
        )
        return LocalWeightStream(manifest, tensors, self._staging)

    def mark_synced(self) -> None:
        """The rollout now has the current weights. Nothing to do: decoupled mode recomputes its proximal
        log-probs from the current weights at each step (kept for the pipeline's contract)."""

    # --- log-probs -------------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    def _forward(
        self, fwd: PolicyForward, mb: MicroBatch, *, with_entropy: bool, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Response-token log-probs and entropy [b, width] of ``fwd`` on ``mb`` (0 at padding)."""
        with self._autocast():
            lp, ent = fwd(
                mb.input_ids, mb.position_ids, mb.rows, mb.cols, mb.targets, with_entropy, entropy_grad
            )
        zeros = torch.zeros(mb.shape, dtype=torch.float32, device=lp.device)
        where = (mb.rows, mb.tcols)
        return zeros.index_put(where, lp), zeros.index_put(where, ent.float())

    def _micro_batches(self, batch: PackedBatch, idx: torch.Tensor) -> list[torch.Tensor | None]:
        """This rank's share of rows ``idx`` of ``batch`` (split across ranks by token count), in
        micro-batches by rows and token budget; ``None`` entries pad this rank to the micro-batch count of
        the busiest rank (FSDP's collectives need every rank to run as many forwards and backwards)."""
        prompt, response = row_lengths(batch)
        p_len, r_len = prompt[idx].tolist(), response[idx].tolist()
        shares = split_by_tokens([a + b for a, b in zip(p_len, r_len, strict=True)], self.ranks.world)
        rows = self.cfg.trainer.micro_batch_size or len(idx)
        order = self.cfg.trainer.micro_batch_order
        plans = [
            [
                [share[i] for i in g]
                for g in plan_rows(
                    [p_len[i] for i in share], [r_len[i] for i in share], rows, self.max_tokens, order
                )
            ]
            for share in shares
        ]
        mine: list[torch.Tensor | None] = [idx[g] for g in plans[self.ranks.rank]]
        return mine + [None] * (pad_plans(plans) - len(mine))

    def _filler(self, batch: PackedBatch) -> MicroBatch:
        """A one-row micro-batch whose results are thrown away (see ``_micro_batches``)."""
        return select(batch, torch.zeros(1, dtype=torch.long, device=self.device), self.pad_id)

    @torch.no_grad()
    def _logprobs_no_grad(self, fwd: PolicyForward, batch: PackedBatch) -> torch.Tensor:
        """[B, R] float32 log-probs on the trainer's device (each rank computes its share, then a sum)."""
        out = torch.zeros(batch.response_mask.shape, dtype=torch.float32, device=self.device)
        for part in self._micro_batches(batch, torch.arange(batch.input_ids.shape[0], device=self.device)):
            self._stop_point()
            if part is None:
                with self.ranks.op("log-probs forward (FSDP all-gather)"):
                    self._forward(fwd, self._filler(batch), with_entropy=False)
                continue
            mb = select(batch, part, self.pad_id)
            with self.ranks.op("log-probs forward (FSDP all-gather)"):
                out[part, : mb.width] = self._forward(fwd, mb, with_entropy=False)[0]
        return self.ranks.all_reduce(out, what="log-probs")

    def pack_samples(self, samples: list[Sample]) -> PackedBatch:
        return pack([s.prompt_ids for s in samples], [s.response_ids for s in samples], self.pad_id)

    def compute_logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """Current-policy log-probs of each sample's response tokens (logits / temperature)."""
        was_training = self.model.training
        self.model.eval()
        try:
            lp = self._logprobs_no_grad(self.policy, self.pack_samples(samples).to(self.device)).cpu()
        finally:
            self.model.train(was_training)
        return [lp[i, : len(s.response_ids)].tolist() for i, s in enumerate(samples)]

    # --- the step ----------------------------------------------------------------------------------------
    def _prepare(self, samples: list[Sample]) -> StepData:
        """Advantages, the loss mask and the old / reference log-probs of one trainer step."""
        ac, dev = self.cfg.algorithm, self.device
        batch = self.pack_samples(samples).to(dev)
        width = batch.response_mask.shape[1]
        adv = scored_advantages(self._advantage_fn, samples, norm_by_std=ac.norm_adv_by_std)
        scored = torch.tensor([not s.unscored for s in samples], dtype=torch.float32)
        mask = batch.response_mask.float() * scored[:, None]  # an unscored sample has no loss
        if any(s.loss_mask is not None for s in samples):  # an environment's tokens are not trained on
            sampled = [s.loss_mask if s.loss_mask is not None else [1] * len(s.response_ids) for s in samples]
            mask = mask * right_pad(sampled, 0, torch.float32, width).to(dev)
        behaviour = right_pad([s.logprobs for s in samples], 0.0, torch.float32, width).to(dev)
        finite = torch.isfinite(behaviour)
        rejected = ((~finite) & (mask > 0)).any(1)
        behaviour = torch.where(finite, behaviour, torch.zeros_like(behaviour))  # no NaN into masked sums
        mask = mask * (~rejected).float()[:, None]
        old, is_w, is_flag = behaviour, None, None
        weigh = OFF_POLICY_WEIGHTS[ac.off_policy]
        if weigh is not None:
            old = self._logprobs_no_grad(self.policy, batch)  # current weights, before this step's update
            is_w, is_flag = weigh(old, behaviour, ac.tis_threshold)
        return StepData(
            batch=batch,
            adv=adv.to(dev)[:, None].expand(-1, width).contiguous(),
            behaviour=behaviour,
            mask=mask,
            old=old,
            is_w=is_w,
            is_flag=is_flag,
            ref=self._reference_logprobs(batch),
            rejected=int(rejected.sum()),
        )

    def _reference_logprobs(self, batch: PackedBatch) -> torch.Tensor | None:
        """[B, R] log-probs of the KL reference (``algorithm.kl_coef > 0``), else None: the frozen
        initial policy, or with LoRA the policy itself with its adapters disabled (peft's
        ``disable_adapter``: the base weights alone, no second copy)."""
        if self.cfg.algorithm.kl_coef <= 0:
            return None
        if self.lora:
            with self.model.disable_adapter():
                return self._logprobs_no_grad(self.policy, batch)
        return self._logprobs_no_grad(self.ref_model, batch)

    def train_step(self, samples: list[Sample], stop: Callable[[], bool] | None = None) -> dict[str, float]:
        """One trainer step on exactly ``trainer.batch_size`` samples; returns metrics (docs/engine.md).

        ``stop``: asked between micro-batches until the first optimizer update; yes abandons the step
        (``StepAborted``, nothing applied: module docstring). Every rank of a group must pass through
        the same points, so followers call this too (their ``stop`` may be None: the leader's counts).
        """
        tc = self.cfg.trainer
        if len(samples) != tc.batch_size:
            raise ValueError(
                f"train_step needs trainer.batch_size={tc.batch_size} samples, got {len(samples)}"
            )
        t0 = time.perf_counter()
        random_state = ckpt.rng_state(self.generator)
        self._stop, self._last_point = stop or _never, t0
        try:
            data = self._prepare(samples)
            sums: dict[str, list[float]] = defaultdict(list)
            for _ in range(tc.ppo_epochs):
                order = torch.randperm(tc.batch_size, generator=self.generator)
                for start in range(0, tc.batch_size, tc.mini_batch_size):
                    for k, v in self._optimizer_step(data, order[start : start + tc.mini_batch_size]).items():
                        sums[k].append(v)
        except StepAborted:
            self.optimizer.zero_grad(set_to_none=True)
            ckpt.set_rng_state(random_state, self.generator)
            raise
        finally:
            self._stop = None
        self._tail_s = time.perf_counter() - self._last_point
        self.version += 1
        metrics = {k: (max(v) if k.endswith("_max") else float(np.mean(v))) for k, v in sums.items()}
        # what a graceful stop waits for in a step (rl_engine.pipeline.stop_grace)
        metrics["timing/stop_gap_max_s"], metrics["timing/step_tail_s"] = self.stop_timings()
        metrics.update(self._off_policy_metrics(data))
        metrics["error/nonfinite_behaviour_logprobs"] = float(data.rejected)
        metrics["trainer/optimizer_steps"] = float(self.optimizer_steps)
        metrics["timing/train_s"] = time.perf_counter() - t0
        return metrics

    def _stop_point(self) -> None:
        """A point where the step may still be abandoned: ask ``stop`` (a max over the ranks)."""
        if self._stop is None:
            return
        now = time.perf_counter()
        self._longest_gap_s = max(self._longest_gap_s, now - self._last_point)
        self._last_point = now
        wanted = bool(self._stop())
        if self.ranks.sharded:
            flag = torch.tensor([1.0 if wanted else 0.0], device=self.device)
            wanted = bool(self.ranks.all_reduce(flag, "max", "stop check").item())
        if wanted:
            raise StepAborted(f"step {self.version + 1} abandoned before its first optimizer update")

    def stop_timings(self) -> tuple[float, float]:
        """(longest stretch between two stop points, the last step's uninterruptible tail), seconds."""
        return self._longest_gap_s, self._tail_s

    def state_bytes(self) -> int:
        """What a checkpoint of this rank holds, about: the weights and AdamW's two moments (float32)."""
        return sum(
            p.numel() * p.element_size() * (3 if p.requires_grad else 1) for p in self.model.parameters()
        )

    def _off_policy_metrics(self, data: StepData) -> dict[str, float]:
        if data.is_w is None:
            return {}
        mask = data.mask.bool()
        raw = torch.exp(data.old - data.behaviour)[mask]
        if not raw.numel():
            return {
                "off_policy/is_ratio_mean": 1.0,
                "off_policy/is_ratio_max": 1.0,
                "off_policy/tis_clipfrac": 0.0,
            }
        values = torch.stack([raw.mean(), raw.max(), data.is_flag[mask].float().mean()]).tolist()
        return dict(
            zip(
                ["off_policy/is_ratio_mean", "off_policy/is_ratio_max", "off_policy/tis_clipfrac"],
                values,
                strict=True,
            )
        )

    def _optimizer_step(self, data: StepData, idx: torch.Tensor) -> dict[str, float]:
        """Gradient accumulation over the micro-batches of ``idx``, then clip, AdamW step, LR step."""
        tc = self.cfg.trainer
        idx = idx.to(self.device)
        mask_all = data.mask[idx]
        norm = {
            "num_seqs": int((mask_all.sum(1) > 0).sum()),  # rejected samples do not count
            "num_tokens": float(mask_all.sum()),
            "norm_len": self.cfg.rollout.max_new_tokens,
        }
        self.optimizer.zero_grad(set_to_none=True)
        acc: dict[str, torch.Tensor] = {}
        for part in self._micro_batches(data.batch, idx):
            self._stop_point()
            with self.ranks.op("forward/backward (FSDP all-gather, reduce-scatter)"):
                self._micro_loss(data, part, norm, acc)
        self._stop_point()
        self._stop = None  # the first update: from here the step runs to its end
        max_norm = tc.grad_clip if tc.grad_clip is not None else float("inf")
        with self.ranks.op("gradient norm"):  # sharded gradients: the norm is a collective
            grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer_steps += 1
        # One device->host transfer for every metric of the step (each float() would synchronise a GPU).
        ratio_max = self.ranks.all_reduce(acc.pop("actor/ratio_max").reshape(1), "max", "metrics")
        sums = self.ranks.all_reduce(torch.stack(list(acc.values())), what="metrics")  # shares add up
        names = [*acc, "actor/ratio_max", "actor/grad_norm"]
        values = dict(
            zip(names, torch.cat([sums, ratio_max, grad_norm.float().reshape(1)]).tolist(), strict=True)
        )
        tokens = max(values.pop("tokens"), 1.0)
        stats = {k: v / tokens if k.endswith("_sum") else v for k, v in values.items()}
        stats = {k.removesuffix("_sum"): v for k, v in stats.items()}
        if stats["actor/ratio_max"] == float("-inf"):  # every token of the mini-batch was masked out
            stats["actor/ratio_max"] = 1.0
        stats["actor/lr"] = lr
        return stats

    def _micro_loss(
        self, data: StepData, part: torch.Tensor | None, norm: dict[str, Any], acc: dict[str, torch.Tensor]
    ) -> None:
        """Forward + backward of one micro-batch (the loss is already normalised to the mini-batch);
        adds its metric sums to ``acc``. ``part`` None: a filler micro-batch of weight 0."""
        ac = self.cfg.algorithm
        weight = float(self.ranks.world)  # FSDP averages the ranks' gradients: their sum is wanted
        if part is None:
            part, weight = torch.zeros(1, dtype=torch.long, device=self.device), 0.0
        mb = select(data.batch, part, self.pad_id)
        w = mb.width
        mask = data.mask[part, :w] * (1.0 if weight else 0.0)
        # Entropy is always reported, but only differentiated when it is part of the loss.
        logp, entropy = self._forward(self.policy, mb, with_entropy=True, entropy_grad=ac.entropy_coef > 0)
        old = data.old[part, :w]
        out = ppo_clip_loss(
            logp,
            old,
            data.adv[part, :w],
            clip_eps_low=ac.clip_eps_low,
            clip_eps_high=ac.clip_eps_high,
            dual_clip_c=ac.dual_clip_c,
        )
        token_loss = out.loss if data.is_w is None else out.loss * data.is_w[part, :w]
        pg_loss = aggregate(token_loss, mask, ac.loss_agg, **norm)
        loss = pg_loss
        parts = {"actor/pg_loss": pg_loss.detach()}
        if data.ref is not None:
            kl = aggregate(kl_k3(logp, data.ref[part, :w]), mask, ac.loss_agg, **norm)
            loss = loss + ac.kl_coef * kl
            parts["actor/kl_ref"] = kl.detach()
        if ac.entropy_coef > 0:
            loss = loss - ac.entropy_coef * aggregate(entropy, mask, ac.loss_agg, **norm)
        (loss * weight).backward()
        with torch.no_grad():
            diff = logp.detach() - old
            parts.update(
                {
                    "actor/entropy_sum": (entropy.detach() * mask).sum(),
                    "actor/clipfrac_sum": (out.clipped.float() * mask).sum(),
                    "actor/dual_clipfrac_sum": (out.dual_clipped.float() * mask).sum(),
                    "actor/approx_kl_sum": (0.5 * diff**2 * mask).sum(),
                    "tokens": mask.sum(),
                }
            )
            ratio_max = out.ratio.detach().masked_fill(mask == 0, float("-inf")).max()
            for k, v in parts.items():
                acc[k] = acc[k] + v if k in acc else v
            acc["actor/ratio_max"] = torch.maximum(acc.get("actor/ratio_max", ratio_max), ratio_max)

    # --- checkpoint ------------------------------------------------------------------------------------
    def save_checkpoint(self, path: Path, extra: dict[str, Any]) -> None:
        """Write model, optimizer, scheduler, version, RNG and ``extra`` atomically (see checkpoint.py).
        A group: every rank calls it, each writes its shards; rank 0 writes the rest."""
        rank, world = self.ranks.rank, self.ranks.world

        def write(tmp: Path) -> None:
            if self.ranks.sharded:
                with self.ranks.op("checkpoint save"):
                    ckpt.save_sharded(
                        tmp / ckpt.SHARDED_DIR, self.model, self.optimizer, trainable_only=self.lora
                    )
                if rank:
                    return
                self._save_model_config(tmp / "model")
                if self.lora:  # the adapters' config, for the export (their weights are the shards)
                    self.model.peft_config["default"].save_pretrained(str(tmp / ADAPTER_DIR))
            elif self.lora:  # the adapters and their AdamW state; the base weights are model.path's
                self._save_model_config(tmp / "model")
                save_adapters(self.model, tmp / ADAPTER_DIR)
                torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            else:
                self.model.save_pretrained(tmp / "model", safe_serialization=True)
                torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            self.tokenizer.save_pretrained(tmp / "model")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(ckpt.rng_state(self.generator), tmp / "rng.pt")
            torch.save(extra, tmp / "extra.pt")
            state = {
                "format_version": ckpt.FORMAT_VERSION,
                "version": self.version,
                "optimizer_steps": self.optimizer_steps,
                "total_optimizer_steps": self.total_optimizer_steps,
                "world_size": world,
                "lora": self.lora,
            }
            (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))

        ckpt.write_atomically_group(Path(path), write, rank, world)

    def _save_model_config(self, directory: Path) -> None:
        """config.json and generation_config.json, without weights (a sharded or a LoRA checkpoint)."""
        self.model.config.save_pretrained(directory)
        if getattr(self.model, "generation_config", None) is not None:
            self.model.generation_config.save_pretrained(directory)

    def _apply_config_hyperparameters(self) -> None:
        """The config's optimizer hyper-parameters win over a checkpoint's: loading the optimizer puts
        back each param group's ``lr``, ``initial_lr``, ``betas`` and ``weight_decay`` as they were saved,
        and loading the scheduler its ``base_lrs``. A run that resumes with a changed config (a fork)
        gets its own: the base learning rate is ``trainer.lr``, scaled by the config's schedule at the
        optimizer step the checkpoint reached; AdamW's moments and step counts are kept."""
        tc = self.cfg.trainer
        reached = self.scheduler.last_epoch  # the optimizer step the checkpoint reached
        for group in self.optimizer.param_groups:
            group["initial_lr"] = tc.lr
            group["betas"] = tuple(tc.betas)
            group["weight_decay"] = tc.weight_decay
        # A scheduler of this config at that step, through torch's public constructor: from
        # ``last_epoch = reached - 1`` it steps once, setting each group's lr to initial_lr x multiplier.
        multiplier, _ = build_lr_multiplier(tc)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, multiplier, last_epoch=reached - 1)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore everything ``save_checkpoint`` wrote; returns the caller's ``extra`` dict. A sharded
        checkpoint loads on any number of ranks (resharded); one rank's only on one rank.

        The config's optimizer hyper-parameters (``trainer.lr`` and its schedule, ``betas``,
        ``weight_decay``) replace the checkpoint's (:meth:`_apply_config_hyperparameters`).

        A ``proximal.safetensors`` written by earlier versions (decoupled mode kept a proximal copy) is
        ignored: the proximal log-probs now come from the current weights.
        """
        path = Path(path)
        state_file = path / "trainer_state.json"
        if not state_file.exists():
            raise FileNotFoundError(f"{path} is not a checkpoint (no trainer_state.json)")
        state = json.loads(state_file.read_text())
        if state.get("format_version") != ckpt.FORMAT_VERSION:
            raise ValueError(f"{path}: checkpoint format {state.get('format_version')} is not supported")
        if bool(state.get("lora", False)) != self.lora:
            raise ValueError(
                f"{path} was written {'with' if state.get('lora') else 'without'} model.lora: resume it "
                f"{'with' if state.get('lora') else 'without'} LoRA adapters"
            )
        if ckpt.is_sharded(path):
            with self.ranks.op("checkpoint load"):
                ckpt.load_sharded(
                    path / ckpt.SHARDED_DIR, self.model, self.optimizer, trainable_only=self.lora
                )
        elif self.ranks.sharded:
            raise ValueError(
                f"{path} was written by one trainer rank: resume it with trainer.world_size 1 "
                f"(a checkpoint of a trainer group resumes on any number of ranks)"
            )
        else:
            if self.lora:
                load_adapters(self.model, path / ADAPTER_DIR)
            else:
                ckpt.copy_named_params(self.model, ckpt.load_safetensors_dir(path / "model"), f"{path}/model")
            self.optimizer.load_state_dict(
                torch.load(path / "optimizer.pt", map_location=self.device, weights_only=False)
            )
        self.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
        self._apply_config_hyperparameters()
        ckpt.set_rng_state(torch.load(path / "rng.pt", weights_only=False), self.generator)
        self.version = int(state["version"])
        self.optimizer_steps = int(state["optimizer_steps"])
        # Checkpoints are written by this code; the pipeline stores plain dataclasses in extra.
        return torch.load(path / "extra.pt", weights_only=False)

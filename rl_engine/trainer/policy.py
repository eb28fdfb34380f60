"""``PolicyTrainer``: one trainer step = advantages -> ppo_epochs x mini-batch AdamW updates -> version + 1.

Log-probs are of logits / ``rollout.temperature`` (the distribution the rollout sampled from), computed
on the shared padding layout of ``rl_engine.models.batching`` so they match the rollout's to float
precision on the same weights.

Old log-probs in the PPO ratio, by ``algorithm.off_policy``:
- ``none``: the behaviour log-probs from the rollout.
- ``tis``: recomputed with the current weights before this step's first update; the per-token loss
  is weighted by min(exp(old - behaviour), tis_threshold) to correct for the rollout being stale.
- ``decoupled``: the proximal policy (weights at the last ``mark_synced``); weighted like ``tis``
  by min(exp(proximal - behaviour), tis_threshold).
"""

from __future__ import annotations

import copy
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_engine.algos import aggregate, get_advantage_fn, group_indices, kl_k3, masked_mean, ppo_clip_loss
from rl_engine.algos.losses import truncated_is_weights
from rl_engine.config import ExperimentConfig
from rl_engine.models import load_model, load_tokenizer, special_token_ids
from rl_engine.models.batching import PackedBatch, pack, right_pad, token_logprobs_and_entropy
from rl_engine.trainer import checkpoint as ckpt
from rl_engine.trainer.schedule import build_lr_multiplier
from rl_engine.types import Sample


def _rows(batch: PackedBatch, idx: torch.Tensor) -> PackedBatch:
    return PackedBatch(
        input_ids=batch.input_ids[idx],
        attention_mask=batch.attention_mask[idx],
        position_ids=batch.position_ids[idx],
        response_mask=batch.response_mask[idx],
        prompt_len=batch.prompt_len,
    )


def _pad_floats(rows: list[list[float]], width: int) -> torch.Tensor:
    return right_pad(rows, 0.0, torch.float32, width)


class PolicyTrainer:
    """The policy and its optimizer; see the module docstring for the update and the contract."""

    def __init__(self, cfg: ExperimentConfig, *, device: str = "cpu"):
        self.cfg = cfg
        tc, ac = cfg.trainer, cfg.algorithm
        torch.set_num_threads(tc.num_threads)
        self.device = torch.device(device)
        self.model = load_model(cfg.model, device=device).train()
        self.tokenizer = load_tokenizer(cfg.model)
        self.pad_id = special_token_ids(cfg.model, self.tokenizer).pad_id  # the rollout pads with the same id
        self.temperature = cfg.rollout.temperature
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
        # Frozen copies only when the config needs them: each costs one model's memory.
        self.ref_model = self._frozen_copy() if ac.kl_coef > 0 else None
        self.proximal_model = self._frozen_copy() if ac.off_policy == "decoupled" else None

    def _frozen_copy(self) -> torch.nn.Module:
        m = copy.deepcopy(self.model).eval()
        for p in m.parameters():
            p.requires_grad_(False)
        return m

    # --- contract: weights ---------------------------------------------------------------------------
    def weights_numpy(self) -> dict[str, np.ndarray]:
        """Contiguous CPU copies by parameter name (bf16/fp16 become float32: numpy has no bfloat16)."""
        out = {}
        for name, p in self.model.named_parameters():
            t = p.detach()
            if t.dtype in (torch.bfloat16, torch.float16):
                t = t.float()
            out[name] = np.ascontiguousarray(t.cpu().numpy()).copy()
        return out

    @torch.no_grad()
    def mark_synced(self) -> None:
        """The rollout now has the current weights: they become the proximal policy (decoupled mode)."""
        if self.proximal_model is not None:
            for dst, src in zip(self.proximal_model.parameters(), self.model.parameters(), strict=True):
                dst.copy_(src)

    # --- log-probs -------------------------------------------------------------------------------------
    def _forward(
        self, model: torch.nn.Module, batch: PackedBatch, with_entropy: bool, entropy_grad: bool = False
    ):
        """Response-token log-probs [b, R] (and entropy [b, R]) of ``model`` on ``batch``."""
        width = batch.response_mask.shape[1]
        out = model(
            input_ids=batch.input_ids.to(self.device),
            attention_mask=batch.attention_mask.to(self.device),
            position_ids=batch.position_ids.to(self.device),
            use_cache=False,
            logits_to_keep=width + 1,  # only the positions that predict response tokens (+1 dropped)
        )
        logits = out.logits[:, :-1, :]
        return token_logprobs_and_entropy(
            logits,
            batch.response_ids.to(self.device),
            self.temperature,
            with_entropy,
            entropy_grad=entropy_grad,
        )

    def _micro_size(self) -> int:
        return self.cfg.trainer.micro_batch_size or self.cfg.trainer.mini_batch_size

    @torch.no_grad()
    def _logprobs_no_grad(self, model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
        mb, rows = self._micro_size(), batch.input_ids.shape[0]
        parts = [
            self._forward(model, _rows(batch, torch.arange(s, min(s + mb, rows))), False)[0]
            for s in range(0, rows, mb)
        ]
        return torch.cat(parts).float().cpu()

    def pack_samples(self, samples: list[Sample]) -> PackedBatch:
        return pack([s.prompt_ids for s in samples], [s.response_ids for s in samples], self.pad_id)

    def compute_logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """Current-policy log-probs of each sample's response tokens (logits / temperature)."""
        was_training = self.model.training
        self.model.eval()
        try:
            lp = self._logprobs_no_grad(self.model, self.pack_samples(samples))
        finally:
            self.model.train(was_training)
        return [lp[i, : len(s.response_ids)].tolist() for i, s in enumerate(samples)]

    # --- the step ----------------------------------------------------------------------------------------
    def _prepare(self, samples: list[Sample]) -> dict[str, Any]:
        """Advantages and the fixed per-token tensors of one trainer step (all [B, R] unless noted)."""
        ac = self.cfg.algorithm
        batch = self.pack_samples(samples)
        width = batch.response_mask.shape[1]
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        adv = self._advantage_fn(
            rewards, group_indices([s.group_id for s in samples]), norm_by_std=ac.norm_adv_by_std
        )
        behaviour = _pad_floats([s.logprobs for s in samples], width)
        prep = {"batch": batch, "adv": adv[:, None].expand(-1, width).contiguous(), "behaviour": behaviour}
        if ac.off_policy == "none":
            prep["old"] = behaviour
            prep["is_w"] = None
        else:
            target = self.proximal_model if ac.off_policy == "decoupled" else self.model
            prep["old"] = self._logprobs_no_grad(target, batch)
            prep["is_w"], prep["is_trunc"] = truncated_is_weights(prep["old"], behaviour, ac.tis_threshold)
        prep["ref"] = self._logprobs_no_grad(self.ref_model, batch) if self.ref_model is not None else None
        return prep

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        """One trainer step on exactly ``trainer.batch_size`` samples; returns metrics (see DESIGN.md)."""
        tc = self.cfg.trainer
        if len(samples) != tc.batch_size:
            raise ValueError(
                f"train_step needs trainer.batch_size={tc.batch_size} samples, got {len(samples)}"
            )
        t0 = time.perf_counter()
        prep = self._prepare(samples)
        sums: dict[str, list[float]] = defaultdict(list)
        for _ in range(tc.ppo_epochs):
            order = torch.randperm(tc.batch_size, generator=self.generator)
            for start in range(0, tc.batch_size, tc.mini_batch_size):
                for k, v in self._optimizer_step(prep, order[start : start + tc.mini_batch_size]).items():
                    sums[k].append(v)
        self.version += 1
        metrics = {k: (max(v) if k.endswith("_max") else float(np.mean(v))) for k, v in sums.items()}
        metrics.update(self._off_policy_metrics(prep, samples))
        metrics["trainer/optimizer_steps"] = float(self.optimizer_steps)
        metrics["timing/train_s"] = time.perf_counter() - t0
        return metrics

    def _off_policy_metrics(self, prep: dict[str, Any], samples: list[Sample]) -> dict[str, float]:
        if prep["is_w"] is None:
            return {}
        mask = prep["batch"].response_mask.bool()
        raw = torch.exp(prep["old"] - prep["behaviour"])[mask]
        return {
            "off_policy/is_ratio_mean": float(raw.mean()) if raw.numel() else 1.0,
            "off_policy/is_ratio_max": float(raw.max()) if raw.numel() else 1.0,
            "off_policy/tis_clipfrac": float(prep["is_trunc"][mask].float().mean()) if raw.numel() else 0.0,
        }

    def _optimizer_step(self, prep: dict[str, Any], idx: torch.Tensor) -> dict[str, float]:
        """Gradient accumulation over micro-batches of ``idx``, then clip, AdamW step, LR step."""
        tc = self.cfg.trainer
        mask_all = prep["batch"].response_mask[idx]
        norm = {
            "num_seqs": len(idx),
            "num_tokens": float(mask_all.sum()),
            "norm_len": self.cfg.rollout.max_new_tokens,
        }
        self.optimizer.zero_grad(set_to_none=True)
        stats: dict[str, float] = defaultdict(float)
        for s in range(0, len(idx), self._micro_size()):
            part = idx[s : s + self._micro_size()]
            for k, v in self._micro_loss(prep, part, norm).items():
                # Sample-weighted mean over micro-batches (max for *_max keys).
                stats[k] = (
                    max(stats.get(k, v), v) if k.endswith("_max") else stats[k] + v * len(part) / len(idx)
                )
        max_norm = tc.grad_clip if tc.grad_clip is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        stats["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer_steps += 1
        stats["actor/grad_norm"] = float(grad_norm)
        return dict(stats)

    def _micro_loss(self, prep: dict[str, Any], part: torch.Tensor, norm: dict[str, Any]) -> dict[str, float]:
        """Forward + backward of one micro-batch; the loss is pre-scaled to the mini-batch normaliser."""
        ac = self.cfg.algorithm
        batch = _rows(prep["batch"], part)
        mask = batch.response_mask.to(self.device).float()
        # Entropy is always reported, but only differentiated when it is part of the loss.
        logp, entropy = self._forward(self.model, batch, with_entropy=True, entropy_grad=ac.entropy_coef > 0)
        old, adv = prep["old"][part].to(self.device), prep["adv"][part].to(self.device)
        out = ppo_clip_loss(
            logp,
            old,
            adv,
            clip_eps_low=ac.clip_eps_low,
            clip_eps_high=ac.clip_eps_high,
            dual_clip_c=ac.dual_clip_c,
        )
        token_loss = out.loss
        if prep["is_w"] is not None:
            token_loss = token_loss * prep["is_w"][part].to(self.device)
        pg_loss = aggregate(token_loss, mask, ac.loss_agg, **norm)
        loss = pg_loss
        frac = len(part) / norm["num_seqs"]  # aggregate() divided by the whole mini-batch's counts
        names = ["actor/pg_loss"]
        values = [pg_loss.detach() / frac]
        if self.ref_model is not None:
            kl = aggregate(kl_k3(logp, prep["ref"][part].to(self.device)), mask, ac.loss_agg, **norm)
            loss = loss + ac.kl_coef * kl
            names.append("actor/kl_ref")
            values.append(kl.detach() / frac)
        if ac.entropy_coef > 0:
            loss = loss - ac.entropy_coef * aggregate(entropy, mask, ac.loss_agg, **norm)
        loss.backward()
        with torch.no_grad():
            diff = logp.detach() - old
            ratio = out.ratio.detach().masked_fill(mask == 0, float("-inf"))
            names += [
                "actor/entropy",
                "actor/clipfrac",
                "actor/dual_clipfrac",
                "actor/approx_kl",
                "actor/ratio_max",
            ]
            values += [
                masked_mean(entropy.detach(), mask),
                masked_mean(out.clipped.float(), mask),
                masked_mean(out.dual_clipped.float(), mask),
                masked_mean(0.5 * diff**2, mask),
                ratio.max() if mask.any() else torch.tensor(1.0),
            ]
            # One device->host transfer for all metrics (each float() would synchronise on a GPU).
            return dict(
                zip(names, torch.stack([v.float().reshape(()) for v in values]).tolist(), strict=True)
            )

    # --- checkpoint ------------------------------------------------------------------------------------
    def save_checkpoint(self, path: Path, extra: dict[str, Any]) -> None:
        """Write model, optimizer, scheduler, version, RNG and ``extra`` atomically (see checkpoint.py)."""
        from safetensors.torch import save_file

        def write(tmp: Path) -> None:
            self.model.save_pretrained(tmp / "model", safe_serialization=True)
            self.tokenizer.save_pretrained(tmp / "model")
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(ckpt.rng_state(self.generator), tmp / "rng.pt")
            torch.save(extra, tmp / "extra.pt")
            if self.proximal_model is not None:
                save_file(
                    {k: v.detach().contiguous() for k, v in self.proximal_model.named_parameters()},
                    str(tmp / "proximal.safetensors"),
                )
            state = {
                "format_version": ckpt.FORMAT_VERSION,
                "version": self.version,
                "optimizer_steps": self.optimizer_steps,
                "total_optimizer_steps": self.total_optimizer_steps,
            }
            (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))

        ckpt.write_atomically(Path(path), write)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore everything ``save_checkpoint`` wrote; returns the caller's ``extra`` dict."""
        from safetensors.torch import load_file

        path = Path(path)
        state_file = path / "trainer_state.json"
        if not state_file.exists():
            raise FileNotFoundError(f"{path} is not a checkpoint (no trainer_state.json)")
        state = json.loads(state_file.read_text())
        if state.get("format_version") != ckpt.FORMAT_VERSION:
            raise ValueError(f"{path}: checkpoint format {state.get('format_version')} is not supported")
        ckpt.copy_named_params(self.model, ckpt.load_safetensors_dir(path / "model"), f"{path}/model")
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
        self.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
        if self.proximal_model is not None:
            prox = path / "proximal.safetensors"
            # A checkpoint from a run without decoupled mode: the policy itself is the proximal one.
            tensors = load_file(str(prox)) if prox.exists() else dict(self.model.named_parameters())
            ckpt.copy_named_params(self.proximal_model, tensors, str(prox))
        ckpt.set_rng_state(torch.load(path / "rng.pt", weights_only=False), self.generator)
        self.version = int(state["version"])
        self.optimizer_steps = int(state["optimizer_steps"])
        # Checkpoints are written by this code; the pipeline stores plain dataclasses in extra.
        return torch.load(path / "extra.pt", weights_only=False)

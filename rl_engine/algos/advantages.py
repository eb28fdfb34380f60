"""Outcome-reward advantage estimators. Pure tensor functions; one scalar advantage per response.

Shapes: ``rewards`` [B] float, ``group_index`` [B] long in [0, G) (responses of one prompt share an
index) -> advantages [B]. The trainer broadcasts a response's advantage to all its tokens.

``ADVANTAGES`` is the registry ``algorithm.advantage`` names an estimator of; the config checks the
name against ``rl_engine.config.names.ADVANTAGES`` (torch-free), which a test keeps equal to it. Torch
is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rl_engine.types import Sample

if TYPE_CHECKING:
    import torch


def group_stats(
    rewards: torch.Tensor, group_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-response group mean, unbiased group std (0 for singleton groups) and group size, each [B]."""
    import torch

    num_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    r = rewards.double()
    counts = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_index, torch.ones_like(r))
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_index, r)
    mean = sums / counts
    dev2 = (r - mean[group_index]) ** 2
    sq = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_index, dev2)
    std = torch.where(counts > 1, (sq / (counts - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))
    return mean[group_index], std[group_index], counts[group_index]


def grpo(
    rewards: torch.Tensor, group_index: torch.Tensor, *, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO: A_i = (r_i - mean_g) / (std_g + eps); without ``norm_by_std``: r_i - mean_g. [B] -> [B]."""
    mean, std, _ = group_stats(rewards, group_index)
    adv = rewards.double() - mean
    if norm_by_std:
        adv = adv / (std + eps)
    return adv.to(rewards.dtype)


def dr_grpo(rewards: torch.Tensor, group_index: torch.Tensor, **_: object) -> torch.Tensor:
    """Dr.GRPO: A_i = r_i - mean_g (no std division, which over-weights near-uniform groups). [B] -> [B]."""
    mean, _, _ = group_stats(rewards, group_index)
    return (rewards.double() - mean).to(rewards.dtype)


def rloo(rewards: torch.Tensor, group_index: torch.Tensor, **_: object) -> torch.Tensor:
    """RLOO: A_i = r_i - mean_{j != i, j in g} r_j = n/(n-1) (r_i - mean_g); 0 for singleton groups."""
    import torch

    mean, _, n = group_stats(rewards, group_index)
    scale = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    return ((rewards.double() - mean) * scale).to(rewards.dtype)


def reinforce_pp(
    rewards: torch.Tensor, group_index: torch.Tensor, *, eps: float = 1e-6, **_: object
) -> torch.Tensor:
    """REINFORCE++ with a group baseline: a_i = r_i - mean_g, then whitened over the whole batch
    (a - mean(a)) / (std(a) + eps), using the unbiased batch std. [B] -> [B].

    A group of one (``rollout.n = 1``) gets a zero baseline: its own mean would cancel its reward
    (A = 0, no gradient). That is REINFORCE++ proper, which has no per-prompt baseline; the batch
    whitening supplies the baseline (the batch mean). The group mean is the "-baseline" variant's.
    """
    import torch

    mean, _, n = group_stats(rewards, group_index)
    a = rewards.double() - torch.where(n > 1, mean, torch.zeros_like(mean))
    if a.numel() > 1:
        a = (a - a.mean()) / (a.std() + eps)
    return a.to(rewards.dtype)


AdvantageFn = Callable[..., "torch.Tensor"]

# The registry, by the name ``algorithm.advantage`` gives.
ADVANTAGES: dict[str, AdvantageFn] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
}


def get_advantage_fn(name: str) -> AdvantageFn:
    if name not in ADVANTAGES:
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of {', '.join(sorted(ADVANTAGES))}"
        )
    return ADVANTAGES[name]


def group_indices(group_ids: list[str]) -> torch.Tensor:
    """Map group id strings to dense indices in order of first appearance: ['a','b','a'] -> [0, 1, 0]."""
    import torch

    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(g, len(seen)) for g in group_ids], dtype=torch.long)


def scored_advantages(fn: AdvantageFn, samples: Sequence[Sample], *, norm_by_std: bool) -> torch.Tensor:
    """[B] advantages of ``samples`` by ``fn``, computed over the scored samples alone: a sample whose
    reward could not be computed (``Sample.unscored``) gets 0 and takes no part in its
    group's baseline, as if it had not been drawn. All scored: ``fn`` on the whole batch."""
    import torch

    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    keep = [i for i, s in enumerate(samples) if not s.unscored]
    if len(keep) == len(samples):
        return fn(rewards, group_indices([s.group_id for s in samples]), norm_by_std=norm_by_std)
    adv = torch.zeros_like(rewards)
    if keep:
        index = torch.tensor(keep, dtype=torch.long)
        groups = group_indices([samples[i].group_id for i in keep])
        adv[index] = fn(rewards[index], groups, norm_by_std=norm_by_std)
    return adv

"""The trainer group in Ray: ``world`` TrainerActor ranks in one placement group, one process group.

``build_trainer_group`` reserves one bundle per rank (``cpus_per_actor`` CPUs, one GPU when the trainer
has GPUs, and ``resources.trainer_node_resources``) in a ``PACK`` placement group: Ray puts the ranks on
as few nodes as fit, and only on nodes that have the custom resources. Rank 0 (the *leader*) hosts the
process group's rendezvous; every rank joins it (gloo on CPU, NCCL on GPU) and builds its
``PolicyTrainer`` shard. The driver talks to the leader only: the leader pulls the batch from the
queue and fans every collective call (train step, weight gather, checkpoint) out to the other ranks
(``rl_engine.pipeline.followers``), so the driver's protocol is the same for one rank and for many.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rl_engine.config import ExperimentConfig


@dataclass
class TrainerGroup:
    """The ranks' actor handles (``ranks[0]`` is the leader), their placement group, and the refs that
    complete when every rank has joined and built its trainer."""

    ranks: list[Any]
    placement: PlacementGroup
    joined: list[Any]

    @property
    def leader(self) -> Any:
        return self.ranks[0]

    def release(self) -> None:
        """Kill the ranks and free their reservation."""
        for a in self.ranks:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(a)
        with contextlib.suppress(Exception):  # already removed
            remove_placement_group(self.placement)


def bundle(cfg: ExperimentConfig) -> dict[str, float]:
    """What one trainer rank asks Ray for."""
    res = cfg.resources
    out = {"CPU": float(res.cpus_per_actor), **{k: float(v) for k, v in res.trainer_node_resources.items()}}
    if res.trainer_gpus:
        out["GPU"] = 1.0
    return out


def build_trainer_group(cfg: ExperimentConfig, knobs: Any, queue: Any, components: Any) -> TrainerGroup:
    """Start the ranks (see the module docstring); wait on ``joined`` before using the leader."""
    from rl_engine.pipeline.trainer_actor import TrainerActor

    world = cfg.resources.trainer_world_size(cfg.trainer.world_size)
    one = bundle(cfg)
    pg = placement_group([dict(one) for _ in range(world)], strategy="PACK")
    ranks = [
        ray.remote(TrainerActor)
        .options(
            num_cpus=one["CPU"],
            num_gpus=one.get("GPU", 0),
            resources={k: v for k, v in one.items() if k not in ("CPU", "GPU")} or None,
            max_concurrency=2,  # a second thread answers cancel / status while a step runs
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r),
        )
        .remote(cfg, knobs, queue, components, rank=r, world=world)
        for r in range(world)
    ]
    # rank 0 picks the rendezvous on its node; Ray hands the ref's value to every rank's join
    endpoint = ranks[0].group_endpoint.remote()
    joined = [a.join.remote(endpoint, ranks[1:] if r == 0 else []) for r, a in enumerate(ranks)]
    return TrainerGroup(ranks, pg, joined)

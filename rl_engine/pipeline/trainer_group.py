"""The trainer group in Ray: ``world`` TrainerActor ranks in one placement group, one process group.

``build_trainer_group`` reserves one bundle per rank (``cpus_per_actor`` CPUs, one GPU when the trainer
has GPUs, and ``resources.trainer_node_resources``) in a ``PACK`` placement group: Ray puts the ranks on
as few nodes as fit, and only on nodes that have the custom resources. Rank 0 (the *leader*) hosts the
process group's rendezvous; every rank joins it (gloo on CPU, NCCL on GPU) and builds its
``PolicyTrainer`` shard. The driver talks to the leader only: the leader pulls the batch from the
queue and fans every collective call (train step, weight gather, checkpoint) out to the other ranks
(``Followers``), so the driver's protocol is the same for one rank and for many. A follower that
dies or fails makes the leader's call fail with an error naming that rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rl_engine.config import ExperimentConfig

T = TypeVar("T")


class TrainerRankError(RuntimeError):
    """A rank of the trainer group died or failed; the message names it."""


@dataclass(frozen=True)
class RankStatus:
    """What one rank is doing, for the watchdog: the operation and for how long (``None``: idle)."""

    rank: int
    op: str | None
    running_s: float


def _why(exc: BaseException) -> str:
    if isinstance(exc, RayActorError):
        return "died (its process exited)"
    cause = exc
    while isinstance(cause, RayTaskError) and getattr(cause, "cause", None) is not None:
        cause = cause.cause
    lines = str(cause).strip().splitlines()
    return f"failed: {type(cause).__name__}: {lines[0] if lines else ''}"


@dataclass
class Followers:
    """The leader's handles on ranks 1..world-1."""

    handles: list[Any] = field(default_factory=list)
    timeout_s: float = 600.0

    def run(self, method: str, args: tuple, own: Callable[[], T]) -> T:
        """Call ``method(*args)`` on every follower and ``own()`` here, at the same time (they meet in
        collectives). A follower's death or failure is raised naming its rank, also when it shows up here
        as a failed collective first."""
        refs = [getattr(h, method).remote(*args) for h in self.handles]
        try:
            result = own()
        except BaseException as exc:
            dead = self._first_failure(refs, wait_s=5.0)
            if dead:
                raise TrainerRankError(dead) from exc
            raise
        failure = self._first_failure(refs, wait_s=self.timeout_s, all_done=True)
        if failure:
            raise TrainerRankError(failure)
        return result

    def _first_failure(self, refs: list[Any], *, wait_s: float, all_done: bool = False) -> str | None:
        if not refs:
            return None
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        for rank, ref in enumerate(refs, start=1):
            if ref in ready:
                try:
                    ray.get(ref)
                except (RayActorError, RayTaskError) as exc:
                    return f"trainer rank {rank} {_why(exc)}"
        if pending and all_done:
            ranks = [i for i, r in enumerate(refs, start=1) if r in pending]
            return f"trainer ranks {ranks} did not finish within {wait_s:.0f} s of rank 0"
        return None

    def statuses(self, timeout_s: float = 2.0) -> list[RankStatus | str]:
        """Each follower's ``RankStatus``, or why it did not answer."""
        out: list[RankStatus | str] = []
        for rank, h in enumerate(self.handles, start=1):
            try:
                out.append(ray.get(h.rank_status.remote(), timeout=timeout_s))
            except GetTimeoutError:
                out.append(f"trainer rank {rank} did not answer")
            except (RayActorError, RayTaskError) as exc:
                out.append(f"trainer rank {rank} {_why(exc)}")
        return out


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

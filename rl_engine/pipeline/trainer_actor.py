"""Trainer actor: pulls batches from the MessageQueue, runs ``PolicyTrainer.train_step``, publishes weights.

It gathers ``trainer.batch_size`` samples in pulls of ``require_batches * mini_batch_size`` samples
(whole groups, FIFO), timing how long it waited (``trainer/idle_ratio``); the queue drops groups that
are too stale for the current version on the way. The driver decides when to sync (every
``trigger_parameter_sync_step`` steps). Object store: ``publish_weights`` streams the weights into the
Ray object store bucket by bucket, in the rollout dtype (``rl_engine.weights.object_store``), and
rollouters load them bucket by bucket, zero-copy. Broadcast (gloo / nccl): ``open_weight_sender``
joins the weight group as rank 0 once, ``broadcast_weights`` sends the buckets of ``bucket_plan``.

A trainer group (``rl_engine.pipeline.trainer_group``) is several of these actors, one per rank: rank 0
(the leader) does all of the above and runs every collective call on the other ranks at the same time
(``Followers``); the others only ever run their part of a collective (``train_on``, ``drain_weights``,
the checkpoint calls). One rank is the same actor with no followers.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ray

from rl_engine.backends import rollout_backend
from rl_engine.config import ExperimentConfig
from rl_engine.envs.transcript import episode_turns
from rl_engine.pipeline.components import Components
from rl_engine.pipeline.followers import Followers, RankStatus
from rl_engine.pipeline.knobs import Knobs
from rl_engine.rewards.base import component_means, sample_parts
from rl_engine.types import (
    ExampleSample,
    QueueBatch,
    Sample,
    SendStats,
    StepAborted,
    StepCancelled,
    StepResult,
)
from rl_engine.weights.broadcast import BucketSender, GroupInit
from rl_engine.weights.buckets import LocalWeightStream, WeightManifest
from rl_engine.weights.object_store import publish_stream
from rl_engine.weights.sync import free_endpoint

_PULL_TIMEOUT_S = 0.25  # bounded waits so a cancel or a pipeline failure is noticed quickly


class TrainerActor:
    """Wraps the policy trainer; one instance per run (threaded actor, ``max_concurrency=2``)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        knobs: Knobs,
        queue: Any,
        components: Components,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.cfg, self.knobs, self.queue, self.components = cfg, knobs, queue, components
        self.rank, self.world = rank, world
        # one rank builds its trainer now; ranks of a group once the process group is up (``join``)
        self.trainer: Any = components.trainer.build(cfg) if world == 1 else None
        self._followers = Followers(timeout_s=cfg.trainer.collective_timeout_s)
        self._op: tuple[str, float] | None = None  # what this rank is doing, since when (watchdog)
        self._built = threading.Event()  # the trainer exists (a rank of a group: after ``join``)
        if self.trainer is not None:
            self._built.set()
        self._cancel = threading.Event()
        self._published: list[Any] = []  # the last sync's object refs, kept alive until the next one
        self._backend = rollout_backend(cfg.rollout.backend)  # how its workers take weights
        self._whole = self._backend.whole_tensors  # the GPU engines load whole tensors
        self._manifest: WeightManifest | None = None
        self._sender: BucketSender | None = None  # rank 0 of a broadcast sync (gloo / nccl)
        self._rng = random.Random(cfg.seed)  # picks example samples for the sink

    # --- the group -------------------------------------------------------------------------------------
    def group_endpoint(self) -> tuple[str, int]:
        """Rank 0: where the trainer group's process group meets (this node, a free port)."""
        return free_endpoint()

    def join(self, endpoint: tuple[str, int], followers: list[Any]) -> None:
        """Join the trainer group's process group and build this rank's shard of the trainer; rank 0 also
        gets the other ranks' handles. Every rank must be called (they wait for each other)."""
        self._followers.handles = list(followers)
        if self.world == 1:
            return
        import torch

        from rl_engine.models import resolve_device
        from rl_engine.trainer.distributed import Ranks, backend_for, init_group

        ranks = Ranks(self.rank, self.world)
        tc, res = self.cfg.trainer, self.cfg.resources
        device = torch.device(resolve_device(tc.device, res.trainer_gpus, "trainer"))
        with self._doing("joining the process group"):
            address, port = endpoint
            init_group(ranks, f"tcp://{address}:{port}", backend_for(device), tc.collective_timeout_s)
        with self._doing("building the trainer"):
            self.trainer = self.components.trainer.build(self.cfg, ranks=ranks)
        self._built.set()

    @contextlib.contextmanager
    def _doing(self, op: str) -> Iterator[None]:
        self._op = (op, time.monotonic())
        try:
            yield
        finally:
            self._op = None

    def rank_status(self) -> RankStatus:
        op = self._op
        return RankStatus(self.rank, op[0] if op else None, time.monotonic() - op[1] if op else 0.0)

    def group_status(self) -> list[RankStatus | str]:
        """Every rank's status (the leader's first), for the watchdog's alert."""
        return [self.rank_status(), *self._followers.statuses()]

    def train_on(self, batch: list[Sample]) -> dict[str, float] | None:
        """A follower's part of a trainer step (the leader gathered ``batch``); None: the group abandoned
        it on the leader's stop request (every rank leaves at the same micro-batch)."""
        with self._doing("train step"):
            try:
                return dict(self.trainer.train_step(batch))
            except StepAborted:
                return None

    def drain_weights(self, split: bool) -> None:
        """A follower's part of a weight sync: the same gathers as the leader's stream, nothing sent."""
        with self._doing("weight gather"):
            for _ in self.trainer.weight_stream(split=split):
                pass

    @property
    def version(self) -> int:
        self._built.wait()  # a call on the second thread may come before ``join`` finished
        return int(self.trainer.version)

    def get_version(self) -> int:
        return self.version

    def cancel(self) -> None:
        """Make ``train_step`` return without training (graceful stop): while it waits for samples, or
        while it trains, at its next micro-batch before the first optimizer update (the trainer's
        ``train_step(stop=...)``; a trainer without that parameter finishes its step)."""
        self._cancel.set()

    def state_bytes(self) -> int:
        """About what a checkpoint of this trainer holds (0: a trainer that does not say)."""
        size = getattr(self.trainer, "state_bytes", None)
        return int(size()) if size is not None else 0

    def train_step(self, num_examples: int = 0, publish: bool = False) -> StepResult | StepCancelled:
        """Gather one batch and train on it. Returns metrics, timings and example samples.

        ``publish``: this step triggers a weight sync: put the new weights in the object store and
        mark them as the proximal policy before returning (``weights_box``, ``publish_s``).
        """
        self._cancel.clear()
        t0 = time.monotonic()
        pulled = self._gather()
        t_wait = time.monotonic() - t0
        if pulled is None:
            return StepCancelled(t_wait)
        batch = pulled.samples
        # before training: a batch the queue should not have let through is never trained on
        stal = self.knobs.batch_staleness(self.version, batch)
        t1 = time.monotonic()
        try:
            with self._doing("train step"):
                metrics = self._followers.run("train_on", (batch,), lambda: self._train_leader(batch))
        except StepAborted:
            ray.get(self.queue.unget.remote(batch))  # a checkpoint taken now must see them as queued
            return StepCancelled(t_wait, abandoned=True, train_s=time.monotonic() - t1)
        t_train = time.monotonic() - t1
        box, publish_s = None, 0.0
        if publish:
            t2 = time.monotonic()
            box = self.publish_weights()
            self.trainer.mark_synced()
            publish_s = time.monotonic() - t2
        return StepResult(
            version=self.version,
            trainer_metrics=metrics,
            wait_s=t_wait,
            train_s=t_train,
            dropped_now=pulled.dropped,
            staleness=stal,
            rewards=[s.reward for s in batch],
            lengths=[s.response_length for s in batch],
            partial=[s.param_version_end > s.param_version_start or s.num_interruptions > 0 for s in batch],
            gen_s=[s.gen_time_s for s in batch],
            uids=[f"{s.group_id}/{i % self.knobs.group_size}" for i, s in enumerate(batch)],
            examples=self._examples(batch, num_examples),
            weights_box=box,
            publish_s=publish_s,
            # each reward component's mean, and an episode's figures (env/turns, env/truncated, ...)
            reward_parts={**component_means([s.extra for s in batch]), **episode_means(batch)},
            unscored=[s.unscored for s in batch],
        )

    def _train_leader(self, batch: list[Sample]) -> dict[str, float]:
        if getattr(self.trainer, "stop_timings", None) is None:  # a trainer that cannot stop mid-step
            return dict(self.trainer.train_step(batch))
        return dict(self.trainer.train_step(batch, stop=self._cancel.is_set))

    def _gather(self) -> QueueBatch | None:
        """``trainer.batch_size`` samples in pulls of whole groups; None when cancelled meanwhile."""
        need = self.cfg.trainer.batch_size
        pull = max(self.knobs.require_batches * self.cfg.trainer.mini_batch_size, self.knobs.group_size)
        got: list[Sample] = []
        dropped = 0
        while len(got) < need:
            if self._cancel.is_set():
                if got:  # hand them back: a checkpoint taken now must still see them as queued
                    ray.get(self.queue.unget.remote(got))
                return None
            res: QueueBatch | None = ray.get(
                self.queue.get.remote(min(pull, need - len(got)), self.version, _PULL_TIMEOUT_S)
            )
            if res is not None:
                got.extend(res.samples)
                dropped += res.dropped
        return QueueBatch(got, dropped)

    def _examples(self, batch: list[Sample], k: int) -> list[ExampleSample]:
        picks = self._rng.sample(range(len(batch)), min(k, len(batch)))
        return [
            ExampleSample(
                prompt=batch[i].prompt_text,
                response=batch[i].response_text,
                answer=batch[i].answer,
                reward=batch[i].reward,
                param_version_start=batch[i].param_version_start,
                param_version_end=batch[i].param_version_end,
                reward_parts=sample_parts(batch[i].extra),
                turns=episode_turns(batch[i]),
            )
            for i in picks
        ]

    # --- weights ---------------------------------------------------------------------------------------
    def _stream(self) -> LocalWeightStream:
        """The trainer's weights as buckets in the rollout dtype (whole tensors for the GPU engines)."""
        return self.trainer.weight_stream(split=not self._whole)

    def publish_weights(self) -> list[Any]:
        """Put the current weights in the object store; returns ``[ObjectRef]`` (boxed: not fetched).

        A trainer with ``weight_stream`` (the real one) sends buckets in the rollout dtype, one bucket of
        extra trainer memory at a time; others (the simulated trainer) put their numpy state dict.
        """
        if getattr(self.trainer, "weight_stream", None) is None:
            self._published = [ray.put(self.trainer.weights_numpy())]
        else:
            with self._doing("weight sync (object store)"):
                outer, buckets = self._followers.run(
                    "drain_weights", (not self._whole,), lambda: publish_stream(self._stream())
                )
            self._published = [outer, *buckets]
        return self._published[:1]

    def bucket_plan(self) -> WeightManifest:
        """The layout every broadcast sync follows (names and shapes do not change during a run)."""
        if self._manifest is None:
            self._manifest = self._stream().manifest
        return self._manifest

    def weight_sync_endpoint(self) -> tuple[str, int]:
        """Where rank 0 (this actor) hosts the weight group's store."""
        return free_endpoint()

    def open_weight_sender(self, address: str, port: int, world: int, backend: str, timeout_s: float) -> None:
        """Join the weight group as rank 0; returns once every rollout rank joined too."""
        init = GroupInit(address, port, world, 0, backend=backend, timeout_s=timeout_s)
        self._sender = self._backend.open_sender(init)

    def broadcast_weights(self) -> SendStats:
        """Send every bucket of ``bucket_plan`` to the group (the rollouters receive at the same time)."""
        if self._sender is None:
            raise RuntimeError("broadcast_weights before open_weight_sender")
        stream = self._stream()
        if stream.manifest != self.bucket_plan():  # the receivers were given that plan
            raise RuntimeError("the trainer's weights no longer match the weight-sync plan")
        sender = self._sender
        with self._doing("weight sync (broadcast)"):
            stats = self._followers.run("drain_weights", (not self._whole,), lambda: sender.send(stream))
        self.trainer.mark_synced()
        return stats

    def mark_synced(self) -> None:
        self.trainer.mark_synced()

    def weights_numpy(self) -> dict[str, np.ndarray]:
        """The whole model's float32 weights (every rank gathers; the leader returns them)."""
        return self._followers.run("weights_numpy", (), self.trainer.weights_numpy)

    # --- checkpoint --------------------------------------------------------------------------------------
    def save_checkpoint(self, path: str, extra: dict[str, Any]) -> int:
        """Save model/optimizer/RNG plus the pipeline's ``extra``; returns the size in bytes. A group:
        every rank writes its shards into the same directory (``PolicyTrainer.save_checkpoint``)."""
        with self._doing("checkpoint save"):
            self._followers.run(
                "save_checkpoint", (path, extra), lambda: self.trainer.save_checkpoint(Path(path), extra)
            )
        if self.rank:
            return 0
        return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        with self._doing("checkpoint load"):
            return dict(
                self._followers.run(
                    "load_checkpoint", (path,), lambda: self.trainer.load_checkpoint(Path(path))
                )
            )


def episode_means(batch: list[Sample]) -> dict[str, float]:
    """``env/<figure>/mean`` of the batch's episodes (``rl_engine.envs``; none for single-turn samples)."""
    return {
        k: v
        for k, v in component_means([s.extra for s in batch], prefix="env/").items()
        if k != "env/done/mean"
    }

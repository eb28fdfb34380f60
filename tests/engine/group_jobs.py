"""Targets for ``spawn_group`` used by the trainer-group tests (run in each rank's process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.trainer_group import TrainJob
from rl_engine.trainer import PolicyTrainer
from rl_engine.trainer.distributed import Ranks


def train_save_train(ranks: Ranks, payload: tuple[TrainJob, str, int]) -> dict[str, Any]:
    """Train ``k`` steps, save a checkpoint (with a pipeline-like ``extra``), train the rest."""
    job, path, k = payload
    trainer = PolicyTrainer(job.cfg, ranks=ranks)
    for samples in job.steps[:k]:
        trainer.train_step(samples)
    at_save = trainer.weights_numpy()
    trainer.save_checkpoint(Path(path), {"data_cursor": 7, "queued": ["a", "b"]} if ranks.rank == 0 else {})
    for samples in job.steps[k:]:
        trainer.train_step(samples)
    return {"at_save": at_save, "final": trainer.weights_numpy(), "version": trainer.version}


def resume_train(ranks: Ranks, payload: tuple[TrainJob, str, int]) -> dict[str, Any]:
    """Resume from the checkpoint and train the steps after ``k``."""
    job, path, k = payload
    trainer = PolicyTrainer(job.cfg, ranks=ranks)
    extra = trainer.load_checkpoint(Path(path))
    resumed_at = trainer.version
    for samples in job.steps[k:]:
        trainer.train_step(samples)
    return {"final": trainer.weights_numpy(), "extra": extra, "resumed_at": resumed_at}


def stall_rank(ranks: Ranks, payload: tuple[TrainJob, int, str]) -> None:
    """Rank ``who`` never joins the step (it sleeps, or its process exits) while the others train."""
    import os
    import time

    job, who, how = payload
    trainer = PolicyTrainer(job.cfg, ranks=ranks)
    if ranks.rank == who:
        if how == "exit":
            os._exit(3)
        time.sleep(600)
    trainer.train_step(job.steps[0])


def stream_weights(ranks: Ranks, payload: tuple[TrainJob, int]) -> dict[str, Any]:
    """Train one step, then stream the weights from the shards in small buckets: rank 0 keeps every
    bucket's bytes, the most the stream's source held at once beyond its shards (a parameter gathered whole
    or a slice of rows received) and the largest bucket."""
    job, bucket_bytes = payload
    trainer = PolicyTrainer(job.cfg, ranks=ranks)
    trainer.train_step(job.steps[0])
    stream = trainer.weight_stream(bucket_bytes=bucket_bytes)
    chunks, bucket_max = [], 0
    for bucket in stream:
        bucket_max = max(bucket_max, bucket.flat.numel() * bucket.flat.element_size())
        chunks.append(bucket.to_bytes().copy())  # a view of the reused staging buffer
    return {
        "buckets": chunks,
        "held": stream.source.peak_bytes,
        "bucket_max": bucket_max,
        "weights": trainer.weights_numpy(),
        "manifest": stream.manifest,
    }


def abandon_then_train(ranks: Ranks, payload: tuple[TrainJob, int]) -> dict[str, Any]:
    """Rank 0's stop says yes at its ``at``-th question (the others never ask to stop): every rank must
    leave the step at that same micro-batch (no rank left waiting in a collective); then the step is
    trained whole."""
    from rl_engine.types import StepAborted

    job, at = payload
    trainer = PolicyTrainer(job.cfg, ranks=ranks)
    asked = [0]

    def stop() -> bool:
        asked[0] += 1
        return asked[0] >= at

    aborted = False
    try:
        trainer.train_step(job.steps[0], stop=stop if ranks.rank == 0 else None)
    except StepAborted:
        aborted = True
    version_after_abort = trainer.version
    trainer.train_step(job.steps[0])
    return {
        "aborted": aborted,
        "version_after_abort": version_after_abort,
        "weights": trainer.weights_numpy(),
    }

"""A trainer group in local processes, without Ray: for the equivalence tests, the benchmark and the GPU check.

``spawn_group`` starts ``world`` processes (``spawn``), joins them in one process group (gloo on CPU,
NCCL on GPU: rank r uses ``cuda:r``) and calls ``target(ranks, payload)`` in each; it returns the
ranks' results in rank order, or raises naming the rank that failed. ``train_on`` is such a target:
it builds a ``PolicyTrainer`` on its rank and trains on the given steps' samples, and rank 0 returns
the final parameters. The pipeline's group runs the same ``PolicyTrainer`` in Ray actors instead.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import queue as queue_mod
import random
import socket
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl_engine.config import ExperimentConfig
from rl_engine.trainer.distributed import Ranks, destroy_group, init_group
from rl_engine.types import Sample


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    rank: int, world: int, port: int, backend: str, timeout_s: float, target: str, payload: Any, out: Any
) -> None:
    ranks = Ranks(rank, world)
    try:
        if backend == "nccl":
            import torch

            torch.cuda.set_device(rank)
        init_group(ranks, f"tcp://127.0.0.1:{port}", backend, timeout_s)
        module, _, attr = target.partition(":")
        result = getattr(importlib.import_module(module), attr)(ranks, payload)
        out.put((rank, True, result))
    except BaseException as exc:  # reported to the parent, which names the rank
        out.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
    finally:
        destroy_group()


def spawn_group(
    world: int, target: str, payload: Any, *, backend: str = "gloo", timeout_s: float = 300.0
) -> list[Any]:
    """Run ``target`` ("module:function", called as ``fn(ranks, payload)``) on ``world`` ranks."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, port, backend, timeout_s, target, payload, out))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    reported: set[int] = set()

    def died() -> str | None:  # a rank whose process exited without reporting is the cause
        for r, p in enumerate(procs):
            p.join(timeout=2.0 if r not in reported else 0)
            if r not in reported and p.exitcode is not None:
                return f"trainer rank {r} died (its process exited with code {p.exitcode})"
        return None

    try:
        while len(results) < world:
            try:
                rank, ok, value = out.get(timeout=timeout_s + 60)
            except queue_mod.Empty:
                missing = sorted(set(range(world)) - set(results))
                raise RuntimeError(
                    died() or f"trainer ranks {missing} did not finish within {timeout_s + 60:.0f} s"
                ) from None
            reported.add(rank)
            if not ok:
                raise RuntimeError(died() or f"trainer rank {rank} failed: {value}")
            results[rank] = value
    finally:
        # After a failure, a rank still running (one that hangs, or waits in a collective the failed rank
        # never joins) is stopped at once; after success every rank is past its last collective and exits.
        for p in procs:
            p.join(timeout=30 if len(results) == world else 0)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world)]


@dataclass
class TrainJob:
    """What ``train_on`` does on each rank: train on each entry of ``steps`` (one trainer step each)."""

    cfg: ExperimentConfig
    steps: list[list[Sample]]
    device: str = "cpu"


def train_on(ranks: Ranks, jobs: list[TrainJob]) -> list[dict[str, Any]]:
    """Target of ``spawn_group``: each job on a fresh trainer; every rank returns its metrics, rank 0
    also the final parameters (float32 numpy by name)."""
    from rl_engine.trainer import PolicyTrainer

    out = []
    for job in jobs:
        device = f"cuda:{ranks.rank}" if job.device == "cuda" else job.device
        trainer = PolicyTrainer(job.cfg, device=device, ranks=ranks)
        metrics = [trainer.train_step(samples) for samples in job.steps]
        weights = trainer.weights_numpy()  # a collective: every rank gathers
        out.append({"metrics": metrics, "weights": weights if ranks.rank == 0 else None})
    return out


def synthetic_samples(
    n: int,
    group_size: int,
    vocab: int,
    *,
    seed: int,
    prompt_len: tuple[int, int],
    response_len: tuple[int, int],
) -> list[Sample]:
    """``n`` scored samples in groups of ``group_size`` with lengths drawn from the given ranges
    (uneven lengths make an uneven token split), random tokens, rewards and behaviour log-probs."""
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        g = i // group_size
        r_len = rng.randint(*response_len)
        samples.append(
            Sample(
                prompt_uid=f"p{g}",
                group_id=f"s{seed}-g{g}",
                prompt_ids=[rng.randrange(3, vocab) for _ in range(rng.randint(*prompt_len))],
                response_ids=[rng.randrange(3, vocab) for _ in range(r_len)],
                logprobs=[float(np.log(rng.uniform(0.05, 0.9))) for _ in range(r_len)],
                finish_reason="length",
                param_version_start=0,
                param_version_end=0,
                reward=float(rng.random() < 0.5),
            )
        )
    return samples

"""Component factories for the broadcast-sync pipeline test: the REAL PolicyTrainer and HF worker, each
writing a digest of its weights (in the rollout dtype) to ``log`` at every sync, so the test can check
that every rollouter holds exactly the trainer's weights after each one. Built by Ray actors by name."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch


def digest(named: Any) -> str:
    """sha256 over (name, bytes) of every tensor, by name."""
    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda kv: kv[0]):
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _record(log: str, who: str, version: int, value: str) -> None:
    with Path(log).open(
        "a"
    ) as f:  # one short line per write: appends from several processes interleave whole
        f.write(f"{who} {version} {value}\n")


def read_log(log: Path) -> list[tuple[str, int, str]]:
    rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return [(who, int(v), d) for who, v, d in rows]


def recording_trainer(cfg: Any, log: str) -> Any:
    from rl_engine.trainer import PolicyTrainer

    class RecordingTrainer(PolicyTrainer):
        def mark_synced(self) -> None:  # the pipeline calls it once the trainer sent a sync
            super().mark_synced()
            weights = ((n, p.to(self.rollout_dtype)) for n, p in self.model.named_parameters())
            _record(log, "trainer", self.version, digest(weights))

    return RecordingTrainer(cfg)


def recording_worker(cfg: Any, log: str, index: int = 0, fail_version: int | None = None) -> Any:
    from rl_engine.backends import build_rollout_worker

    worker = build_rollout_worker(cfg, index=index)
    load = worker.update_weights  # receive_weights loads through it too

    def update_weights(weights: Any, version: int) -> None:
        if version == fail_version and index == 0:
            raise ValueError(f"injected load failure at version {version}")
        load(weights, version)
        _record(log, f"rollouter{index}", worker.version, digest(worker.model.named_parameters()))

    worker.update_weights = update_weights
    return worker

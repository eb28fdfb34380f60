"""Shared fixtures: one private Ray instance per test session, a recording sink, configs.

The simulated rollout worker/trainer (harness.simulated) stand in for GPU inference
engines in orchestration tests only; tests about learning, parity or log-probs use the real HF
worker and PolicyTrainer on the tiny model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from rl_engine.config import ExperimentConfig, TinyModelSpec, parse_config
from rl_engine.pipeline.components import Components, Factory
from rl_engine.types import Sample


class RecordingSink:
    """A MetricsSink that keeps everything in memory (thread-safe; tests read it afterwards)."""

    def __init__(self) -> None:
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.events: list[tuple[str, str, dict]] = []
        self.samples: list[tuple[int, list[dict]]] = []
        self._lock = threading.Lock()

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        with self._lock:
            self.metrics.append((step, dict(metrics)))

    def log_event(self, kind: str, message: str, data: dict | None = None) -> None:
        with self._lock:
            self.events.append((kind, message, dict(data or {})))

    def log_samples(self, step: int, samples: list[dict]) -> None:
        with self._lock:
            self.samples.append((step, list(samples)))

    def close(self) -> None:
        pass

    def kinds(self, kind: str) -> list[tuple[str, str, dict]]:
        return [e for e in self.events if e[0] == kind]


@pytest.fixture(scope="session")
def ray_session():
    import ray

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_AUTH_MODE"] = "disabled"
    tmp = tempfile.mkdtemp(prefix="rlp_", dir="/tmp")
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
    yield ray
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny HF model (random weights), built once per session."""
    from rl_engine.models.tiny import save_tiny_model

    return save_tiny_model(TinyModelSpec(seed=0), tmp_path_factory.mktemp("models") / "tiny-llama")


def group(uid: str, version: int, n: int = 4) -> list[Sample]:
    """One finished group of ``n`` samples of prompt ``uid`` generated from weights ``version``."""
    return [
        Sample(
            prompt_uid=uid,
            group_id=uid,
            prompt_ids=[1],
            response_ids=[2, 3],
            logprobs=[-1.0, -1.0],
            finish_reason="stop",
            param_version_start=version,
            param_version_end=version,
        )
        for _ in range(n)
    ]


def sim_config(**overrides: Any) -> ExperimentConfig:
    """A small config for orchestration tests (the model path is not read by the simulated parts)."""
    data: dict[str, Any] = {
        "name": "sim",
        "seed": 0,
        "model": {"path": "/nonexistent/sim-model"},
        "rollout": {"backend": "hf", "n": 4, "max_new_tokens": 64},
        "trainer": {"total_steps": 6, "batch_size": 16, "mini_batch_size": 16},
        "pipeline": {"mode": "fully_async", "staleness_threshold": 1, "watchdog_timeout_s": 30.0},
        "logging": {"sinks": [], "samples_per_step": 2},
    }
    for key, value in overrides.items():
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return parse_config(data)


def sim_components(worker: dict | None = None, trainer: dict | None = None) -> Components:
    return Components(
        worker=Factory(
            "harness.simulated:sim_worker",
            {
                "slots": 8,
                "decode_step_s": 0.0005,
                "chunk_steps": 4,
                "len_median": 8,
                "len_cap": 64,
                **(worker or {}),
            },
        ),
        prompts=Factory("harness.simulated:sim_prompts"),
        reward=Factory("harness.simulated:sim_reward"),
        trainer=Factory("harness.simulated:sim_trainer", {"train_token_s": 0.0001, **(trainer or {})}),
        prepare=None,
    )

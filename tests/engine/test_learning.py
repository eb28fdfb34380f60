"""The whole engine learns, through the product's one driver: ``run_experiment`` on demo-cpu's task and
pipeline settings (fully_async, staleness 2: rollouter, queue, trainer and weight sync are the real
actors; the model is the tiny HF one).

It proves that the gradient points the right way end to end: a flipped sign in the loss or the
advantages, rewards that do not reach the trainer, or weights that never reach the rollouter keep the
reward near 0, and this test fails.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rl_engine.pipeline import run_experiment

_MAX_STEPS = 700  # ~250-450 steps to 0.8 on this seed; the run stops early once clearly learned
_WINDOW = 20


class _StopWhenLearned:
    """A metrics sink that records ``reward/mean`` per step and requests a graceful stop (the same
    stop a user's cancel sends) once the mean over the last ``_WINDOW`` steps exceeds 0.8."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.rewards: list[float] = []

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.rewards.append(metrics["reward/mean"])
        if len(self.rewards) >= _WINDOW and np.mean(self.rewards[-_WINDOW:]) > 0.8:
            self.stop.set()

    def log_event(self, kind: str, message: str, data: dict | None = None) -> None:
        pass

    def log_samples(self, step: int, samples: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.slow
def test_demo_task_reward_rises_from_near_zero(make_cfg):
    cfg = make_cfg("seed=1", "logging.sinks=[]", "logging.log_every=1", f"trainer.total_steps={_MAX_STEPS}")
    stop = threading.Event()
    sink = _StopWhenLearned(stop)
    summary = run_experiment(cfg, sink, stop_event=stop)
    history = sink.rewards
    assert len(history) == summary.steps_done
    assert np.mean(history[:_WINDOW]) < 0.2
    assert np.mean(history[-_WINDOW:]) > 0.7, (
        f"reward stayed at {np.mean(history[-_WINDOW:]):.2f} after {len(history)} steps"
    )
    assert summary.stopped, "the reward never crossed 0.8: the run went to its step cap"

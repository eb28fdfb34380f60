"""A run scored by the reference remote reward service (a real process), killed mid-run, through the real
pipeline (Ray actors, the HF worker and PolicyTrainer on the tiny model): before the kill every sample is
scored; after it the samples are unscored and counted (``reward/unscored``), left out of the step's reward
figures, an alert names the failing reward, and the run goes on to its last step."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.reward_service import RewardServiceProcess
from rl_engine.config import parse_config
from rl_engine.pipeline import run_experiment
from rl_engine.presets import get_preset
from rl_engine.wire import EventKind
from tests.pipeline.conftest import RecordingSink

pytestmark = pytest.mark.timeout(300)

KILL_AFTER_STEP = 2
TOTAL_STEPS = 6


class KillingSink(RecordingSink):
    """Kills the reward service once step ``KILL_AFTER_STEP``'s metrics arrive."""

    def __init__(self, service: RewardServiceProcess) -> None:
        super().__init__()
        self.service = service

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        super().log_metrics(step, metrics)
        if step == KILL_AFTER_STEP and "reward/unscored_ratio" in metrics:
            self.service.kill()


def test_a_killed_reward_service_leaves_samples_unscored_counted_and_alerted_and_the_run_goes_on(
    ray_session, tiny_dir: Path
):
    service = RewardServiceProcess().start()
    try:
        data = get_preset("demo-cpu")
        data["model"] = {"path": str(tiny_dir)}
        data["rollout"].update({"n": 4, "max_new_tokens": 4})
        data["trainer"].update({"total_steps": TOTAL_STEPS, "batch_size": 16, "mini_batch_size": 16})
        data["pipeline"] = {"mode": "one_step_off"}
        url = service.url("math_verify")
        data["reward"] = {
            "name": "http",
            "kwargs": {"url": url, "batch_size": 8, "retries": 1, "backoff_s": 0.05, "timeout_s": 5},
            "unscored_alert_ratio": 0.2,
        }
        data["logging"] = {"sinks": [], "log_every": 1}
        sink = KillingSink(service)
        summary = run_experiment(parse_config(data), sink)
    finally:
        service.kill()
    assert summary.steps_done == TOTAL_STEPS  # the run went on

    steps = {step: m for step, m in sink.metrics if "reward/unscored_ratio" in m}
    assert sorted(steps) == list(range(1, TOTAL_STEPS + 1))
    for step in range(1, KILL_AFTER_STEP + 1):  # the service was up: every sample scored
        assert steps[step]["reward/unscored_ratio"] == 0.0 and "reward/mean" in steps[step]
        assert steps[step]["reward/unscored"] == 0
    last = steps[TOTAL_STEPS]
    assert last["reward/unscored_ratio"] == 1.0  # generated after the kill: none could be scored
    assert "reward/mean" not in last  # no reward figure made of unscored zeros
    assert last["reward/unscored"] >= 16 and last["reward/errors"] == 0

    alerts = [e for e in sink.kinds(EventKind.ALERT) if "unscored" in e[1]]
    assert len(alerts) == 1, sink.events  # once per episode, the service never came back
    message, detail = alerts[0][1], alerts[0][2]
    assert "'http'" in message and detail["step"] > KILL_AFTER_STEP and detail["unscored_ratio"] > 0.2

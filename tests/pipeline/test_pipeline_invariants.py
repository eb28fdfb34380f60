"""Invariants of the pipeline, proven on the real actors/queue/sync with simulated engine costs
(the simulated rollout worker and trainer stand in for GPU engines; see conftest)."""

from __future__ import annotations

import threading

import pytest

from rl_engine.pipeline import PipelineError, run_experiment
from rl_engine.pipeline.knobs import knobs_from_config
from tests.pipeline.conftest import RecordingSink, sim_components, sim_config

REQUIRED_METRICS = {
    "reward/mean", "reward/std", "response_length/mean", "timing/gen_s", "timing/train_s",
    "async/staleness_mean", "async/staleness_max", "async/queue_size", "async/partial_ratio",
    "async/dropped_stale", "async/param_version", "trainer/idle_ratio", "rollouter/idle_ratio",
    "throughput/tokens_per_s", "off_policy/is_ratio_mean", "actor/clipfrac",
}


def _assert_conserved(summary) -> None:
    """Every admitted sample is trained on, still queued, in flight at a rollouter, or counted dropped."""
    assert summary.admitted == summary.samples_trained + summary.queued + summary.in_flight + summary.dropped_stale


@pytest.mark.parametrize(
    ("mode", "extra"),
    [
        ("sync", {}),
        ("one_step_off", {}),
        ("fully_async", {"pipeline.staleness_threshold": 1, "pipeline.partial_rollout": True}),
        ("fully_async", {"pipeline.staleness_threshold": 0, "pipeline.trigger_parameter_sync_step": 2,
                         "pipeline.num_rollouters": 2, "pipeline.prompts_per_call": 1}),
    ],
    ids=["sync", "one_step_off", "fully_async_partial", "fully_async_trigger2_two_rollouters"],
)
def test_no_sample_exceeds_the_staleness_bound_and_samples_are_conserved(ray_session, mode, extra):
    cfg = sim_config(**{"pipeline.mode": mode, "trainer.total_steps": 6, **extra})
    bound = knobs_from_config(cfg).max_staleness
    sink = RecordingSink()
    # long tails and slow-ish decoding so that rollouts really overlap training and get interrupted
    summary = run_experiment(cfg, sink, components=sim_components(
        worker={"len_median": 12, "len_cap": 64, "decode_step_s": 0.001}, trainer={"train_token_s": 0.0002}))
    assert summary.steps_done == 6 and summary.samples_trained == 6 * 16
    steps = [s for s, _ in sink.metrics]
    assert steps == [1, 2, 3, 4, 5, 6]
    for _, m in sink.metrics:
        assert set(m) >= REQUIRED_METRICS, REQUIRED_METRICS - set(m)
        assert m["async/staleness_max"] <= bound
    stal = [m["async/staleness_max"] for _, m in sink.metrics]
    if mode == "sync":
        assert set(stal) == {0.0}
    if mode == "one_step_off":
        assert stal[1:] == [1.0] * 5  # batch k+1 was generated on weights k while step k trained
    if extra.get("pipeline.trigger_parameter_sync_step") == 2:
        assert max(stal) == 1.0  # weights only every 2 steps: one version of lag, never more
    _assert_conserved(summary)
    assert len(sink.samples) == 6 and all(len(s) == 2 for _, s in sink.samples)


def test_partial_rollout_interrupts_and_records_the_version_span(ray_session):
    cfg = sim_config(**{"pipeline.staleness_threshold": 2, "trainer.total_steps": 6,
                        "pipeline.prompts_per_call": 4})
    sink = RecordingSink()
    summary = run_experiment(cfg, sink, components=sim_components(
        worker={"len_median": 24, "len_cap": 200, "decode_step_s": 0.002, "slots": 4}))
    ratios = [m["async/partial_ratio"] for _, m in sink.metrics]
    assert max(ratios) > 0, "no trained sample spanned a weight update"
    spans = [ex for _, exs in sink.samples for ex in exs if ex["param_version_end"] > ex["param_version_start"]]
    assert all(ex["param_version_end"] >= ex["param_version_start"] for _, exs in sink.samples for ex in exs)
    assert summary.steps_done == 6
    _assert_conserved(summary)
    assert spans or max(ratios) > 0


def test_a_failing_rollouter_fails_the_run_with_its_error(ray_session):
    cfg = sim_config(**{"trainer.total_steps": 50})
    with pytest.raises(PipelineError, match="simulated rollout failure at call 3"):
        run_experiment(cfg, RecordingSink(), components=sim_components(worker={"fail_at_call": 3}))


def test_a_failing_trainer_fails_the_run_with_its_error(ray_session):
    cfg = sim_config(**{"trainer.total_steps": 50})
    with pytest.raises(PipelineError, match=r"train failed: RuntimeError: simulated trainer failure at step 3"):
        run_experiment(cfg, RecordingSink(), components=sim_components(trainer={"fail_at_step": 3}))


class _StopOnAlert(RecordingSink):
    """Requests a stop when an alert for ``stage`` arrives. Other stages may alert first (the trainer
    starves while the rollout hangs), so the stop waits for the one the test is about."""

    def __init__(self, stop: threading.Event, stage: str) -> None:
        super().__init__()
        self.stop, self.stage = stop, stage

    def log_event(self, kind: str, message: str, data: dict | None = None) -> None:
        super().log_event(kind, message, data)
        if kind == "alert" and (data or {}).get("stage") == self.stage:
            self.stop.set()


def test_watchdog_reports_a_stuck_rollout_and_the_run_still_stops(ray_session):
    stop = threading.Event()
    sink = _StopOnAlert(stop, stage="rollout 0")
    backstop = threading.Timer(60.0, stop.set)  # without the alert, stop anyway and fail below, not hang
    backstop.start()
    cfg = sim_config(**{"trainer.total_steps": 50, "pipeline.watchdog_timeout_s": 1.0})
    try:
        summary = run_experiment(cfg, sink, stop_event=stop,
                                 components=sim_components(worker={"hang_at_call": 4}))
    finally:
        backstop.cancel()
    alerts = [a for a in sink.kinds("alert") if a[2].get("stage") == "rollout 0"]
    assert alerts and "rollout call on rollouter 0 made no progress" in alerts[0][1]
    assert summary.stopped and summary.steps_done < 50
    assert sink.kinds("status")[-1][1].startswith("stopped")


def test_watchdog_reports_a_slow_weight_sync(ray_session):
    sink = RecordingSink()
    cfg = sim_config(**{"trainer.total_steps": 2, "pipeline.watchdog_timeout_s": 0.5})
    summary = run_experiment(cfg, sink, components=sim_components(worker={"update_hang_s": 1.5}))
    alerts = [a for a in sink.kinds("alert") if a[2].get("stage") == "weight sync"]
    assert len(alerts) == 1 and "weight sync made no progress" in alerts[0][1]
    assert summary.steps_done == 2 and summary.sync_times_s[0] >= 1.5

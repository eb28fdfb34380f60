"""Invariants of the pipeline, proven on the real actors/queue/sync with simulated engine costs
(the simulated rollout worker and trainer stand in for GPU engines; see conftest)."""

from __future__ import annotations

import threading

import pytest

from rl_engine.pipeline import PipelineError, run_experiment
from rl_engine.pipeline.knobs import knobs_from_config
from tests.pipeline.conftest import RecordingSink, sim_components, sim_config

REQUIRED_METRICS = {
    "reward/mean",
    "reward/std",
    "response_length/mean",
    "timing/gen_s",
    "timing/train_s",
    "async/staleness_mean",
    "async/staleness_max",
    "async/queue_size",
    "async/partial_ratio",
    "async/dropped_stale",
    "async/param_version",
    "trainer/idle_ratio",
    "rollouter/idle_ratio",
    "throughput/tokens_per_s",
    "off_policy/is_ratio_mean",
    "actor/clipfrac",
}


def _assert_conserved(summary) -> None:
    """Every admitted sample is trained on, still queued, in flight at a rollouter, or counted dropped."""
    assert (
        summary.admitted
        == summary.samples_trained + summary.queued + summary.in_flight + summary.dropped_stale
    )


def _admission_bound(cfg, steps: int) -> int:
    """Most samples the queue may admit (net of drops) in a run of ``steps`` steps: rollouters last
    receive weights at the last sync before the final step, and admission never runs ahead of that."""
    knobs = knobs_from_config(cfg)
    last_sync = (steps - 1) // knobs.trigger * knobs.trigger
    return knobs.admission_capacity(last_sync)


# rollouter 1 decodes so slowly (20 minutes a chunk) that none of its groups ever finishes: each is
# interrupted by the syncs and dropped once it can no longer meet the bound (a forced drop)
_STRAGGLER = {1: {"decode_step_s": 300.0}}


@pytest.mark.parametrize(
    ("mode", "extra"),
    [
        # pulls of 8 samples (require_batches x mini_batch_size), two per step
        ("sync", {"pipeline.require_batches": 2, "trainer.mini_batch_size": 4}),
        ("one_step_off", {}),
        (
            "fully_async",
            {
                "pipeline.staleness_threshold": 1,
                "pipeline.partial_rollout": True,
                "pipeline.num_rollouters": 2,
                "pipeline.prompts_per_call": 1,
            },
        ),
        # two rollouters with two concurrent calls each, and a queue bound (8) tighter than the
        # staleness bound: several producers must not overfill it
        (
            "fully_async",
            {
                "pipeline.staleness_threshold": 0,
                "pipeline.trigger_parameter_sync_step": 2,
                "pipeline.num_rollouters": 2,
                "pipeline.prompts_per_call": 1,
                "pipeline.rollout_concurrency": 2,
                "pipeline.queue_max_size": 8,
                "trainer.mini_batch_size": 4,
            },
        ),
    ],
    ids=[
        "sync_require_batches",
        "one_step_off",
        "fully_async_partial_straggler_drops",
        "fully_async_trigger2_concurrent_bounded_queue",
    ],
)
def test_no_sample_exceeds_the_staleness_bound_and_samples_are_conserved(ray_session, mode, extra):
    cfg = sim_config(**{"pipeline.mode": mode, "trainer.total_steps": 6, **extra})
    bound = knobs_from_config(cfg).max_staleness
    sink = RecordingSink()
    straggler = extra.get("pipeline.num_rollouters") == 2 and extra.get("pipeline.partial_rollout")
    # long tails and slow-ish decoding so that rollouts really overlap training and get interrupted
    worker = {
        "len_median": 12,
        "len_cap": 64,
        "decode_step_s": 0.001,
        **({"per_index": _STRAGGLER} if straggler else {}),
    }
    summary = run_experiment(
        cfg, sink, components=sim_components(worker=worker, trainer={"train_token_s": 0.0002})
    )
    assert summary.steps_done == 6 and summary.samples_trained == 6 * 16
    steps = [s for s, _ in sink.metrics]
    assert steps == [1, 2, 3, 4, 5, 6]
    for _, m in sink.metrics:
        assert set(m) >= REQUIRED_METRICS, REQUIRED_METRICS - set(m)
        assert m["async/staleness_max"] <= bound
    stal = [m["async/staleness_max"] for _, m in sink.metrics]
    _assert_conserved(summary)
    # admission never ran ahead of the weights the rollouters held
    assert summary.admitted - summary.dropped_stale <= _admission_bound(cfg, 6)
    if mode == "sync":
        assert set(stal) == {0.0}
        assert summary.admitted == 6 * 16  # not one sample generated beyond what was trained
    if mode == "one_step_off":
        assert stal[1:] == [1.0] * 5  # batch k+1 was generated on weights k while step k trained
    if mode in ("sync", "one_step_off"):
        # one rollouter, one call at a time, whole batches per call: groups finish in admission order
        # and admission keeps each within the bound, so nothing can be dropped
        assert summary.dropped_stale == 0 and summary.dropped_uids == []
    if straggler:
        assert summary.dropped_stale >= 4 and len(summary.dropped_uids) == summary.dropped_stale
        # every drop is the straggler's: rollouter 1 gets the odd prompts (unit j goes to j % 2)
        assert all(int(uid.split("/")[0][1:]) % 2 == 1 for uid in summary.dropped_uids)
        assert all(int(uid.split("/")[0][1:]) % 2 == 0 for uid in summary.trained_uids)
    if extra.get("pipeline.trigger_parameter_sync_step") == 2:
        assert max(stal) == 1.0  # weights only every 2 steps: one version of lag, never more
        assert 0 < summary.max_queued <= 8  # 12 without the bound
    assert len(sink.samples) == 6 and all(len(s) == 2 for _, s in sink.samples)


def test_partial_rollout_interrupts_and_records_the_version_span(ray_session):
    cfg = sim_config(
        **{
            "pipeline.staleness_threshold": 2,
            "trainer.total_steps": 6,
            "pipeline.prompts_per_call": 4,
            "logging.samples_per_step": 16,
        }
    )
    sink = RecordingSink()
    summary = run_experiment(
        cfg,
        sink,
        components=sim_components(
            worker={"len_median": 24, "len_cap": 200, "decode_step_s": 0.002, "slots": 4}
        ),
    )
    assert summary.steps_done == 6
    trained = [ex for _, exs in sink.samples for ex in exs]  # every trained sample (16 per step)
    assert len(trained) == 6 * 16
    assert all(ex["param_version_end"] >= ex["param_version_start"] for ex in trained)
    spans = [ex for ex in trained if ex["param_version_end"] > ex["param_version_start"]]
    assert spans, "no trained sample spans two weight versions"
    assert max(m["async/partial_ratio"] for _, m in sink.metrics) > 0
    _assert_conserved(summary)


def test_a_failing_rollouter_fails_the_run_with_its_error(ray_session):
    cfg = sim_config(**{"trainer.total_steps": 50})
    with pytest.raises(PipelineError, match="simulated rollout failure at call 3"):
        run_experiment(cfg, RecordingSink(), components=sim_components(worker={"fail_at_call": 3}))


def test_a_failing_trainer_fails_the_run_with_its_error(ray_session):
    cfg = sim_config(**{"trainer.total_steps": 50})
    with pytest.raises(
        PipelineError, match=r"train failed: RuntimeError: simulated trainer failure at step 3"
    ):
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
        summary = run_experiment(
            cfg, sink, stop_event=stop, components=sim_components(worker={"hang_at_call": 4})
        )
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

"""Graceful stop and lossless resume, on the real actors with simulated engine costs."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from rl_engine.jobspec import Placement
from rl_engine.pipeline import PipelineError, run_experiment
from rl_engine.pipeline.checkpoint import list_checkpoints
from tests.pipeline.conftest import RecordingSink, sim_components, sim_config

# long responses, few slots: a generate call is always running when the checkpoint pauses rollouters
_SLOW_WORKER = {"len_median": 24, "len_cap": 160, "decode_step_s": 0.001, "slots": 4}
_BASE = {
    "pipeline.mode": "fully_async",
    "pipeline.partial_rollout": True,
    "pipeline.staleness_threshold": 1,
    "pipeline.prompts_per_call": 2,
    "trainer.total_steps": 8,
}


class _StopAfter(RecordingSink):
    def __init__(self, stop: threading.Event, step: int) -> None:
        super().__init__()
        self.stop, self.at = stop, step

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        super().log_metrics(step, metrics)
        if step >= self.at:
            self.stop.set()


def test_stop_event_checkpoints_announces_and_returns(ray_session, tmp_path):
    stop = threading.Event()
    sink = _StopAfter(stop, 2)
    cfg = sim_config(**{**_BASE, "trainer.total_steps": 50})
    summary = run_experiment(cfg, sink, placement=Placement(checkpoint_dir=str(tmp_path)), stop_event=stop,
                             components=sim_components(worker=_SLOW_WORKER))  # fmt: skip
    assert summary.stopped and 2 <= summary.steps_done < 50
    ((_, _, data),) = sink.kinds("checkpoint")
    assert data["step"] == summary.steps_done and Path(data["path"]).is_dir() and data["size_bytes"] > 0
    assert summary.last_checkpoint == data["path"]
    assert sink.kinds("status")[-1][1] == f"stopped at step {summary.steps_done}"


def test_a_stop_during_a_long_step_abandons_it_and_keeps_the_last_completed_one(ray_session, tmp_path):
    """A trainer step much longer than any grace (a stand-in trainer: ~10 s of modelled training a step,
    stoppable between 0.05 s slices as the real one is between micro-batches): a stop while step 2
    trains abandons it (its samples back to the queue) and checkpoints step 1, instead of waiting out the
    step. The run also said, before, how long a graceful stop needs."""
    stop = threading.Event()
    sink = _StopAfter(stop, 1)  # step 1 is logged while step 2 trains
    cfg = sim_config(**{**_BASE, "trainer.total_steps": 3})
    summary = run_experiment(cfg, sink, placement=Placement(checkpoint_dir=str(tmp_path)), stop_event=stop,
                             components=sim_components(worker=_SLOW_WORKER, trainer={"train_token_s": 0.02}))  # fmt: skip
    assert summary.stopped and summary.steps_done == 1
    assert [s for s, _ in sink.metrics] == [1]
    (abandoned,) = [e for e in sink.kinds("log") if "abandoned" in e[1]]
    assert abandoned[1].startswith("step 2 abandoned") and abandoned[2]["step"] == 1
    ((_, _, data),) = sink.kinds("checkpoint")
    assert data["step"] == 1 and [s for s, _ in list_checkpoints(tmp_path)] == [1]
    restored, _, trained_before = _checkpoint_samples(Path(data["path"]))
    assert len(trained_before) == 16  # one step's samples, not two
    assert len(restored) >= 16  # step 2's batch went back to the queue: the resume trains it
    graces = [e[2]["stop_grace_s"] for e in sink.kinds("status") if "stop_grace_s" in e[2]]
    assert graces and all(g > 0 for g in graces)


def _checkpoint_samples(path: Path) -> tuple[set[str], int, set[str]]:
    """uids of the queued and in-flight samples a (simulated trainer's) checkpoint holds, how many of
    them were unfinished (interrupted partial rollouts), and the uids trained before it was written."""
    state = json.loads((path / "state.json").read_text())
    extra = state["extra"]["pipeline"]
    uids, unfinished = set(), 0
    for g in extra["queue"]["groups"]:
        uids.update(f"{s['group_id']}/{i}" for i, s in enumerate(g))
    for r in extra["rollouters"]:
        for g in r["pending"]:
            uids.update(f"{s['group_id']}/{i}" for i, s in enumerate(g))
            unfinished += sum(s["finish_reason"] == "abort" for s in g)
        for unit in r["parked"]:
            uids.update(f"{p['uid']}/{j}" for p in unit for j in range(4))  # rollout.n = 4
    return uids, unfinished, set(state["trained_uids"])


def test_crash_then_resume_is_lossless(ray_session, tmp_path):
    bs = 16
    reference = run_experiment(
        sim_config(**_BASE), RecordingSink(), components=sim_components(worker=_SLOW_WORKER)
    )
    assert reference.samples_trained == 8 * bs

    # the same run, checkpointing every 3 steps, dies at step 5 (its trainer raises: process state is lost)
    crash_cfg = sim_config(**{**_BASE, "trainer.checkpoint_every": 3})
    with pytest.raises(PipelineError, match="simulated trainer failure"):
        run_experiment(
            crash_cfg,
            RecordingSink(),
            placement=Placement(checkpoint_dir=str(tmp_path)),
            components=sim_components(worker=_SLOW_WORKER, trainer={"fail_at_step": 5}),
        )
    ((step, path),) = list_checkpoints(tmp_path)
    assert step == 3
    restored, unfinished, trained_before = _checkpoint_samples(path)
    assert restored and unfinished > 0, "the checkpoint should hold interrupted in-flight samples"
    assert len(trained_before) == 3 * bs

    sink = RecordingSink()
    resumed = run_experiment(
        sim_config(**_BASE),
        sink,
        placement=Placement(resume_from=str(path)),
        components=sim_components(worker=_SLOW_WORKER),
    )
    assert [s for s, _ in sink.metrics] == [4, 5, 6, 7, 8]  # the step counter continues, no jump
    assert resumed.start_step == 3 and resumed.steps_done == 8
    assert resumed.samples_trained == reference.samples_trained
    # no sample trained before the checkpoint is trained again (the prompt stream resumed where it was)
    assert len(resumed.trained_uids) == 5 * bs and not set(resumed.trained_uids) & trained_before
    # one rollouter, whole batches per call: nothing can be dropped, so every queued / in-flight
    # sample of the checkpoint was trained on after the resume
    assert resumed.dropped_stale == 0 and restored <= set(resumed.trained_uids)
    assert (
        resumed.admitted
        == resumed.samples_trained + resumed.queued + resumed.in_flight + resumed.dropped_stale
    )
    assert any("resumed from" in e[1] for e in sink.kinds("status"))

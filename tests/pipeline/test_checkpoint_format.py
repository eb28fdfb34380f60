"""Checkpoints written before the actors exchanged typed messages still load and resume.

``data/format1_checkpoint/step_00000002`` was written by the pipeline as of commit 3411076 (its
messages were dicts) with the simulated parts: ``sim_config`` with ``fully_async``, partial rollout,
``staleness_threshold=1``, ``prompts_per_call=2``, ``rollout_concurrency=2``, checkpoint every 2 steps,
the worker of ``_WORKER`` and ``sim_trainer(weight_mb=0.0005)``. Its pipeline state holds two queued
groups, two interrupted groups (six unfinished samples) and one parked unit of two prompts: every part
of the on-disk format.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

from rl_engine.jobspec import Placement
from rl_engine.pipeline import run_experiment
from rl_engine.pipeline.checkpoint import pipeline_extra, restore_parts
from rl_engine.types import PauseState, Prompt, QueueCounters, QueueSnapshot, Sample
from tests.pipeline.conftest import RecordingSink, sim_components, sim_config

OLD = Path(__file__).parent / "data" / "format1_checkpoint" / "step_00000002"
_WORKER = {"len_median": 12, "len_cap": 48, "decode_step_s": 0.002, "slots": 4}
_CFG = {
    "pipeline.mode": "fully_async",
    "pipeline.partial_rollout": True,
    "pipeline.staleness_threshold": 1,
    "pipeline.prompts_per_call": 2,
    "pipeline.rollout_concurrency": 2,
    "trainer.total_steps": 4,
}


def _old_state() -> dict[str, Any]:
    return json.loads((OLD / "state.json").read_text())


def _restored() -> tuple[QueueSnapshot, list[PauseState]]:
    return restore_parts(_old_state()["extra"], num_rollouters=1)


def test_an_old_checkpoint_loads_as_typed_messages():
    queue, (state,) = _restored()
    assert queue.counters == QueueCounters(admitted=56, generated=40, consumed=32, dropped_stale=0)
    assert [[s.group_id for s in g] for g in queue.groups] == [["p8"] * 4, ["p9"] * 4]
    assert all(isinstance(s, Sample) and s.finish_reason == "stop" for g in queue.groups for s in g)
    assert [[s.group_id for s in g] for g in state.pending] == [["p10"] * 4, ["p11"] * 4]
    unfinished = [s for g in state.pending for s in g if s.finish_reason == "abort"]
    assert len(unfinished) == 6 and all(len(s.logprobs) == len(s.response_ids) for s in unfinished)
    assert any(s.response_ids for s in unfinished)  # interrupted mid-response: the prefix is kept
    assert [[p.uid for p in unit] for unit in state.parked] == [["p12", "p13"]]
    assert all(isinstance(p, Prompt) and len(p.token_ids) == 16 for p in state.parked[0])
    assert (state.prompts, state.in_flight) == ({"next_index": 14}, 16)


def test_the_typed_state_is_written_back_in_the_same_format():
    extra = _old_state()["extra"]
    queue, states = restore_parts(extra, num_rollouters=1)
    assert pipeline_extra(2, queue, states) == extra


def test_a_rollouters_sampler_state_goes_through_the_json_of_a_checkpoint_and_an_old_one_has_none():
    queue, (state,) = _restored()
    assert state.sampler is None  # written before the sampler state was saved: the worker's seed then
    sampler = bytes(range(256)) * 20  # any bytes (a torch generator's state is 5,056 of them)
    extra = pipeline_extra(2, queue, [dataclasses.replace(state, sampler=sampler)])
    _, (back,) = restore_parts(json.loads(json.dumps(extra)), num_rollouters=1)
    assert back == dataclasses.replace(state, sampler=sampler)


def test_a_rollouter_state_with_the_older_single_parked_slot_loads():
    extra = _old_state()["extra"]
    older = copy.deepcopy(extra)
    r = older["pipeline"]["rollouters"][0]
    r["parked_prompts"] = r.pop("parked")[0]
    _, (state,) = restore_parts(older, num_rollouters=1)
    assert [[p.uid for p in unit] for unit in state.parked] == [["p12", "p13"]]
    r["parked_prompts"] = None  # nothing parked
    assert restore_parts(older, num_rollouters=1)[1][0].parked == []


def test_a_run_resumes_losslessly_from_an_old_checkpoint(ray_session):
    queue, (state,) = _restored()
    restored = {f"{s.group_id}/{i}" for g in queue.groups + state.pending for i, s in enumerate(g)}
    restored |= {f"{p.uid}/{j}" for p in state.parked[0] for j in range(4)}  # rollout.n = 4
    trained_before = set(_old_state()["trained_uids"])
    sink = RecordingSink()
    resumed = run_experiment(
        sim_config(**_CFG),
        sink,
        placement=Placement(resume_from=str(OLD)),
        components=sim_components(worker=_WORKER),
    )
    assert [s for s, _ in sink.metrics] == [3, 4] and resumed.start_step == 2
    assert resumed.samples_trained == 4 * 16  # the counters continued from the checkpoint's
    assert not set(resumed.trained_uids) & trained_before
    # the admission bound leaves room for exactly the 24 restored samples plus 8 new ones: all of the
    # restored ones are trained, none dropped
    assert resumed.dropped_stale == 0 and restored <= set(resumed.trained_uids)
    assert resumed.admitted == resumed.samples_trained + resumed.queued + resumed.in_flight

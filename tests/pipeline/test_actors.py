"""The Rollouter and TrainerActor classes driven in this process (no driver), against a real
MessageQueue actor, at the exact moments the pipeline runs cannot hit on purpose: a checkpoint pause
while a loop thread is between admission and parking, two threads parking at once, a batch the queue
should never have let through. The rollout engine is the simulated one (a GPU engine stand-in); the
seed test uses the real HF worker on the tiny model."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness.simulated import SimPromptStream
from rl_engine.config import apply_overrides, parse_config
from rl_engine.pipeline.components import real_prompts, real_worker
from rl_engine.pipeline.knobs import StalenessViolation, knobs_from_config
from rl_engine.pipeline.queue import MessageQueue
from rl_engine.pipeline.rollouter import Rollouter
from rl_engine.pipeline.trainer_actor import TrainerActor
from rl_engine.presets import get_preset
from rl_engine.types import PauseState
from tests.pipeline.conftest import group, sim_components, sim_config

_WAIT_S = 120.0  # generous: the machine is shared; nothing below is timed


class _GatedStream(SimPromptStream):
    """A prompt stream whose draws block until the test opens ``gate``: a loop thread that was
    admitted by the queue sits in ``next_batch``, i.e. between admission and start/parking."""

    def __init__(self) -> None:
        super().__init__(sim_config())
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)

    def next_batch(self, k: int) -> list[Any]:
        self.entered.release()
        assert self.gate.wait(_WAIT_S), "the test never opened the gate"
        return super().next_batch(k)


def _rollouter(ray: Any, cfg: Any, queue: Any = None) -> tuple[Rollouter, Any]:
    knobs = knobs_from_config(cfg)
    queue = queue or ray.remote(MessageQueue).remote(knobs, 0)
    return Rollouter(cfg, knobs, 0, 1, queue, sim_components()), queue


def _pause_while_gated(r: Rollouter, stream: _GatedStream) -> PauseState:
    """Pause the rollouter while its threads are inside the gate, then open the gate."""
    out: dict[str, PauseState] = {}
    t = threading.Thread(target=lambda: out.update(state=r.pause()), daemon=True)
    t.start()
    t.join(2.0)  # a pause that does not wait for the admitted threads has returned by now
    stream.gate.set()
    t.join(_WAIT_S)
    assert not t.is_alive(), "pause never returned"
    return out["state"]


def _wait_admitted(ray: Any, queue: Any, n: int) -> None:
    deadline = time.monotonic() + _WAIT_S
    while ray.get(queue.stats.remote()).admitted < n:
        assert time.monotonic() < deadline, f"never admitted {n} samples"
        time.sleep(0.05)


def test_a_pause_records_prompts_admitted_but_not_yet_parked_and_a_resume_generates_them(ray_session):
    ray = ray_session
    # sync: one generate call of 4 prompts x 4 = 16 samples is exactly one batch, all the queue admits
    cfg = sim_config(**{"pipeline.mode": "sync", "pipeline.prompts_per_call": 4})
    r, queue = _rollouter(ray, cfg)
    r.prompts = stream = _GatedStream()
    r.start()
    assert stream.entered.acquire(timeout=_WAIT_S)  # admitted (16 slots), drawing its prompts
    state = _pause_while_gated(r, stream)
    assert ray.get(queue.stats.remote()).admitted == 16
    # the checkpoint state holds every admitted slot: the 4 prompts are parked, not lost
    assert state.in_flight == 16
    assert [[p.uid for p in unit] for unit in state.parked] == [["p0", "p1", "p2", "p3"]]
    snapshot = ray.get(queue.snapshot.remote())
    r.stop()

    # resume from that state: a fresh queue and rollouter generate the parked prompts (a checkpoint that
    # lost them would leave the 16 admitted slots unfillable and this wait would never end)
    knobs = knobs_from_config(cfg)
    queue2 = ray.remote(MessageQueue).remote(knobs, 0)
    ray.get(queue2.restore.remote(snapshot))
    r2, _ = _rollouter(ray, cfg, queue2)
    r2.restore(state)
    r2.start()
    try:
        got = ray.get(queue2.get.remote(16, 0, _WAIT_S))
    finally:
        r2.stop()
    assert got is not None, "the resumed rollouter never generated the admitted prompts"
    assert sorted({s.group_id for s in got.samples}) == ["p0", "p1", "p2", "p3"]
    assert ray.get(queue2.stats.remote()).admitted == 16  # nothing admitted twice


def test_two_threads_parking_at_once_both_keep_their_prompts(ray_session):
    ray = ray_session
    cfg = sim_config(**{"pipeline.rollout_concurrency": 2, "pipeline.prompts_per_call": 1})
    r, queue = _rollouter(ray, cfg)
    r.prompts = stream = _GatedStream()
    r.start()
    _wait_admitted(ray, queue, 8)  # both loop threads were admitted one call (1 prompt x 4) each
    state = _pause_while_gated(r, stream)
    try:
        assert state.in_flight == 8 and r.in_flight() == 8
        assert sorted(p.uid for unit in state.parked for p in unit) == ["p0", "p1"]
    finally:
        r.stop()


def test_each_rollouter_samples_with_its_own_seed(tiny_dir: Path):
    data = get_preset("demo-cpu")
    data["model"].pop("tiny")
    cfg = parse_config(apply_overrides(data, [f"model.path={tiny_dir}", "rollout.max_new_tokens=4"]))
    prompts = real_prompts(cfg).next_batch(4)

    def responses(index: int) -> list[list[int]]:
        return [s.response_ids for s in real_worker(cfg, index=index).generate(prompts, 4)]

    first = responses(0)
    assert responses(0) == first  # one rollouter is reproducible from the run's seed
    assert responses(1) != first  # a second rollouter does not draw the same samples


def test_the_trainer_refuses_a_too_stale_batch_before_training_on_it(ray_session):
    ray = ray_session
    cfg = sim_config(**{"pipeline.mode": "sync"})  # max staleness 0
    # a queue with a looser bound stands in for a queue bug that lets stale samples through
    loose_queue = ray.remote(MessageQueue).remote(
        knobs_from_config(sim_config(**{"pipeline.staleness_threshold": 3})), 0
    )
    trainer = TrainerActor(cfg, knobs_from_config(cfg), loose_queue, sim_components())
    trainer.trainer.version = 2
    for i in range(4):
        ray.get(loose_queue.put.remote(group(f"g{i}", 2 if i else 1)))
    with pytest.raises(
        StalenessViolation, match=r"sample g0/0 .* staleness 1 > max_staleness 0 \(sync\); not trained"
    ):
        trainer.train_step(publish=True)
    assert trainer.version == 2 and trainer.trainer.trained_uids == []  # nothing trained


def test_a_pause_that_the_engine_ignores_fails_clearly_instead_of_hanging(ray_session):
    """A GPU engine (the simulated worker stands in for it) that never returns after interrupt(): the
    control call gives up after the engine's control timeout with a message naming the rollouter, and
    releases its hold on the loop."""
    cfg = sim_config(
        **{
            "rollout": {"backend": "vllm", "n": 4, "max_new_tokens": 64, "control_timeout_s": 1.0},
            "resources.rollout_gpus": 1,
        }
    )
    knobs = knobs_from_config(cfg)
    queue = ray_session.remote(MessageQueue).remote(knobs, 0)
    r = Rollouter(cfg, knobs, 0, 1, queue, sim_components(worker={"hang_at_call": 1}))
    r.start()
    deadline = time.monotonic() + _WAIT_S
    while not r.health().call_running_s:
        assert time.monotonic() < deadline, "the rollouter never started a call"
        time.sleep(0.05)
    with pytest.raises(RuntimeError, match=r"rollouter 0: the running call did not return within 1 s"):
        r.pause()
    assert r._hold == 0


def test_a_rollouter_sets_its_processs_heap_from_the_environment(monkeypatch):
    """Every Rollouter actor fixes glibc's mmap threshold at its start (rl_engine.rollout.heap: the HF
    decode loop's heap stays flat); a bad value fails its construction, naming the variable."""
    from rl_engine.rollout.heap import DEFAULT_MMAP_THRESHOLD, MMAP_THRESHOLD_ENV

    cfg = sim_config()
    knobs = knobs_from_config(cfg)
    monkeypatch.delenv(MMAP_THRESHOLD_ENV, raising=False)
    heap = Rollouter(cfg, knobs, 0, 1, None, sim_components()).heap
    assert (heap.threshold, heap.applied) == (DEFAULT_MMAP_THRESHOLD, True)
    monkeypatch.setenv(MMAP_THRESHOLD_ENV, "lots")
    with pytest.raises(ValueError, match=MMAP_THRESHOLD_ENV):
        Rollouter(cfg, knobs, 0, 1, None, sim_components())

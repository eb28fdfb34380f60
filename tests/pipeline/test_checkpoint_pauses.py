"""A checkpoint pause abandoned because one rollouter does not answer (a stop request, then the
watchdog timeout): the rollouters that did pause are unpaused at once, and the next checkpoint (the
final one of a stopping run) reuses the pause still running instead of queueing a second one behind it.

Real Rollouter actors (simulated engine: a GPU engine stand-in) and the real Waiter; rollouter 1's
engine call blocks until the test opens a gate file, and with partial rollout off its pause waits for
that call."""

from __future__ import annotations

import threading
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from rl_engine.pipeline.components import Factory
from rl_engine.pipeline.knobs import knobs_from_config
from rl_engine.pipeline.pauses import RolloutPauses
from rl_engine.pipeline.queue import MessageQueue
from rl_engine.pipeline.rollouter import Rollouter
from rl_engine.pipeline.watch import StopWaitAbandoned, Waiter
from tests.pipeline.conftest import RecordingSink, sim_components, sim_config
from tests.pipeline.gated_reward import open_gate

_WAIT_S = 60.0


def _paused_and_back(ray: Any, rollouter: Any) -> bool:
    """Whether a fresh pause of ``rollouter`` returns (it cannot while an earlier pause still holds it)."""
    ready, _ = ray.wait([rollouter.pause.remote()], timeout=10.0)
    if not ready:
        return False
    ray.get(rollouter.unpause.remote(), timeout=_WAIT_S)
    return True


def test_an_abandoned_pause_unpauses_the_paused_and_the_next_checkpoint_reuses_the_late_pause(
    ray_session, tmp_path
):
    ray = ray_session
    gate = tmp_path / "gate"
    cfg = sim_config(
        **{
            "pipeline.partial_rollout": False,
            "pipeline.num_rollouters": 2,
            "pipeline.watchdog_timeout_s": 1.0,
        }
    )
    knobs = knobs_from_config(cfg)
    components = replace(
        sim_components(),
        worker=Factory(
            "tests.pipeline.gated_worker:gated_worker",
            {"gate": str(gate), "gated_index": 1, "slots": 8, "len_median": 8, "len_cap": 64},
        ),
    )
    queue = ray.remote(MessageQueue).remote(knobs, 0)
    rollouters = [
        ray.remote(Rollouter).options(max_concurrency=6).remote(cfg, knobs, i, 2, queue, components)
        for i in range(2)
    ]
    try:
        # rollouter 1 starts first (the queue admits it before rollouter 0 takes every slot) and is
        # inside its gated engine call before the checkpoint starts
        ray.get(rollouters[1].start.remote(), timeout=_WAIT_S)
        deadline = threading.Event()
        for _ in range(int(_WAIT_S / 0.1)):
            if ray.get(rollouters[1].health.remote(), timeout=_WAIT_S).call_running_s > 0:
                break
            deadline.wait(0.1)
        else:
            pytest.fail("rollouter 1 never started an engine call")
        ray.get(rollouters[0].start.remote(), timeout=_WAIT_S)

        sink = RecordingSink()
        stop = threading.Event()
        stop.set()  # a stopping run: a wait that does not finish within the watchdog timeout is abandoned
        run = SimpleNamespace(stop=stop, sink=sink, cfg=cfg, trainer=None, rollouters=rollouters)
        pauses = RolloutPauses(rollouters, Waiter(run))

        with pytest.raises(StopWaitAbandoned), pauses.held("checkpoint pause"):
            pytest.fail("the pause of rollouter 1 cannot have returned: its engine call is gated")
        # rollouter 0 paused and was unpaused on the way out; rollouter 1's pause is still running
        assert _paused_and_back(ray, rollouters[0])
        assert set(pauses.outstanding) == {1}

        open_gate(gate)  # rollouter 1's call returns: its (first) pause now holds it
        with pauses.held("checkpoint pause") as states:
            assert len(states) == 2 and not pauses.outstanding
        # both unpaused after the checkpoint; a second pause of rollouter 1 was never queued (it would
        # still hold the rollouter now)
        assert _paused_and_back(ray, rollouters[0]) and _paused_and_back(ray, rollouters[1])
    finally:
        for r in rollouters:
            ray.get(r.stop.remote(2.0), timeout=_WAIT_S)
            ray.kill(r)
        ray.kill(queue)

"""MessageQueue (a real Ray actor) and the staleness arithmetic of the modes."""

from __future__ import annotations

import pytest

from rl_engine.config import ConfigError
from rl_engine.pipeline.knobs import knobs_from_config
from rl_engine.pipeline.queue import MessageQueue, PipelineFailure
from tests.pipeline.conftest import group, sim_config


@pytest.mark.smoke
def test_modes_map_to_knobs_of_one_schedule():
    sync = knobs_from_config(sim_config(**{"pipeline.mode": "sync", "pipeline.staleness_threshold": 3}))
    assert (sync.max_staleness, sync.partial_rollout) == (0, False)
    off = knobs_from_config(sim_config(**{"pipeline.mode": "one_step_off"}))
    assert (off.max_staleness, off.trigger) == (1, 1)
    fa = knobs_from_config(
        sim_config(**{"pipeline.staleness_threshold": 1, "pipeline.trigger_parameter_sync_step": 4})
    )
    # rollouters hold versions 0, 4, 8...: 3 versions of lag are unavoidable, B=1 adds one window of 4
    assert fa.max_staleness == 7
    assert fa.admission_capacity(4) == (4 + 7 + 1) * 16
    on_policy = knobs_from_config(sim_config(**{"pipeline.staleness_threshold": 0}))
    assert on_policy.max_staleness == sync.max_staleness == 0


@pytest.mark.smoke
def test_queue_admits_within_bound_drops_stale_and_counts(ray_session):
    ray = ray_session
    knobs = knobs_from_config(
        sim_config(
            **{"pipeline.staleness_threshold": 1, "trainer.batch_size": 8, "trainer.mini_batch_size": 8}
        )
    )
    q = ray.remote(MessageQueue).remote(knobs, 0)
    # version 0, max staleness 1: (0 + 1 + 1) * 8 = 16 samples may be admitted, not 20
    assert ray.get([q.try_admit.remote(4, 0) for _ in range(4)]) == [True] * 4
    assert ray.get(q.try_admit.remote(4, 0)) is False
    assert ray.get(q.try_admit.remote(4, 1)) is True  # a newer rollout version opens a new batch
    for i in range(4):
        ray.get(q.put.remote(group(f"g{i}", 0)))
    ray.get(q.put.remote(group("g4", 1)))
    # trainer at version 2: the four version-0 groups (staleness 2 > 1) are dropped, never trained
    out = ray.get(q.get.remote(4, 2, 1.0))
    assert [s.group_id for s in out.samples] == ["g4"] * 4
    assert out.dropped == 16
    stats = ray.get(q.stats.remote())
    assert (stats.dropped_stale, stats.consumed, stats.queued) == (16, 4, 0)
    assert stats.admitted == stats.consumed + stats.queued + stats.dropped_stale
    assert len(ray.get(q.dropped_uids.remote())) == 16
    # dropped samples free their admission slots: 20 admitted - 16 dropped + 12 <= (1 + 1 + 1) * 8
    assert ray.get(q.try_admit.remote(12, 1)) is True


def test_queue_get_times_out_without_samples_and_raises_a_reported_failure(ray_session):
    ray = ray_session
    knobs = knobs_from_config(sim_config())
    q = ray.remote(MessageQueue).remote(knobs, 0)
    assert ray.get(q.get.remote(4, 0, 0.05)) is None
    ray.get(q.fail.remote("rollouter 0: RuntimeError: boom"))
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(q.get.remote(4, 0, 5.0))
    assert isinstance(info.value.cause, PipelineFailure)
    assert "boom" in str(info.value.cause)


def test_unget_returns_samples_to_the_front_uncounted(ray_session):
    ray = ray_session
    knobs = knobs_from_config(sim_config())
    q = ray.remote(MessageQueue).remote(knobs, 0)
    for i in range(3):
        ray.get(q.put.remote(group(f"g{i}", 0)))
    taken = ray.get(q.get.remote(8, 0, 1.0)).samples
    ray.get(q.unget.remote(taken))
    again = ray.get(q.get.remote(12, 0, 1.0)).samples
    assert [s.group_id for s in again][::4] == ["g0", "g1", "g2"]
    assert ray.get(q.stats.remote()).consumed == 12


def test_queue_max_size_bounds_queued_plus_in_flight(ray_session):
    ray = ray_session
    q = ray.remote(MessageQueue).remote(knobs_from_config(sim_config()), 8)
    # two producers each admitted 4 samples: nothing is queued yet, but 8 will be: a third must wait
    assert ray.get([q.try_admit.remote(4, 0), q.try_admit.remote(4, 0)]) == [True, True]
    assert ray.get(q.try_admit.remote(4, 0)) is False
    ray.get(q.put.remote(group("g0", 0)))
    ray.get(q.put.remote(group("g1", 0)))
    assert ray.get(q.stats.remote()).max_depth == 8
    assert ray.get(q.try_admit.remote(4, 0)) is False
    ray.get(q.get.remote(4, 0, 1.0))  # consuming frees room
    assert ray.get(q.try_admit.remote(4, 0)) is True


@pytest.mark.smoke
def test_a_queue_bound_that_can_never_fill_a_pull_is_a_config_error_at_its_field():
    # one generate call is 4 prompts x 4 = 16 samples: refused by the config itself, before any knob
    with pytest.raises(
        ConfigError, match=r"pipeline.queue_max_size: must be 0 or at least 16 samples"
    ) as exc:
        sim_config(**{"pipeline.queue_max_size": 8})
    assert [path for path, _ in exc.value.errors] == ["pipeline.queue_max_size"]
    ok = sim_config(
        **{"pipeline.queue_max_size": 8, "pipeline.prompts_per_call": 1, "trainer.mini_batch_size": 8}
    )
    assert knobs_from_config(ok).prompts_per_call == 1

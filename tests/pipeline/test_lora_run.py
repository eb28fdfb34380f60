"""``model.lora`` through the whole pipeline: a real run (real PolicyTrainer with peft adapters, two real HF
rollouters on the tiny model) whose syncs carry the adapters only. After every sync each rollouter holds
exactly the trainer's model (digests of every parameter in the rollout dtype: the frozen base weights
each side loaded, and the adapters the sync brought), over the object store and over a gloo broadcast.
"""

from __future__ import annotations

import pytest

from tests.pipeline.test_gloo_sync import _cfg, _components
from tests.pipeline.weight_digest import read_log

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("backend", ["gloo", "object_store"])
def test_a_lora_run_syncs_the_adapters_and_every_rollouter_holds_the_trainers_model(
    ray_session, tiny_dir, tmp_path, backend
):
    from rl_engine.pipeline import run_experiment
    from tests.pipeline.conftest import RecordingSink

    log = tmp_path / "digests"
    cfg = _cfg(
        tiny_dir, "model.lora={rank: 4, alpha: 8}", "trainer.lr=0.01", f"pipeline.sync_backend={backend}"
    )
    summary = run_experiment(cfg, RecordingSink(), components=_components(log))
    assert summary.steps_done == 3 and not summary.stopped
    sent = {v: d for who, v, d in read_log(log) if who == "trainer"}
    assert sorted(sent) == [1, 2] and len(set(sent.values())) == 2  # the adapters moved between syncs
    for i in range(2):
        held = [(v, d) for who, v, d in read_log(log) if who == f"rollouter{i}"]
        assert held == sorted(sent.items()), f"rollouter {i}"

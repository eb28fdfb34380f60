"""What a run's reported metric can decide through the median rule (docs/api.md, "Trust boundary"):
only the runs of its own sweep are compared, and a non-finite value is left out."""

from __future__ import annotations

import math

import pytest

from experiments.services import run_transition
from sweeps.early_stopping import median_rule, sweeps_early_stop
from sweeps.models import SweepRun
from sweeps.services import EarlyStopping
from tests.platform.conftest import client_for
from tracking.services import Point, metrics_ingest


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("goal", ["max", "min"])
def test_non_finite_values_neither_judge_nor_count(goal, bad):
    rule = EarlyStopping(min_steps=0, min_runs=2)
    finite = {1: [(5, 0.5)], 2: [(5, 0.4)], 3: [(5, 0.6)]}
    poisoned = {**finite, 4: [(5, bad)], 5: [(5, bad)], 6: [(5, bad)]}
    # Left out, the three bad runs change nothing: the same verdicts as without them.
    assert median_rule(poisoned, [1, 2, 3], goal=goal, rule=rule) == median_rule(
        finite, [1, 2, 3], goal=goal, rule=rule
    )
    # A run with only non-finite values is not judged either.
    assert median_rule(poisoned, [4], goal=goal, rule=rule) == []
    # A bad point among good ones: the run is judged by its finite points.
    mixed = {**finite, 1: [(4, 0.5), (5, bad)]}
    assert median_rule(mixed, [1], goal=goal, rule=rule) == median_rule(finite, [1], goal=goal, rule=rule)


def _sweep(client, experiment, lrs):
    body = {
        "experiment": experiment.pk, "metric": "m", "method": "grid", "search_space": {"trainer.lr": lrs},
        "early_stopping": {"min_steps": 0, "min_runs": 2}, "max_concurrent": 10,
    }  # fmt: skip
    resp = client.post("/api/sweeps", body, format="json")
    assert resp.status_code == 201, resp.content
    return [m.run_id for m in SweepRun.objects.filter(sweep_id=resp.json()["id"]).order_by("index")]


def test_only_runs_of_the_same_sweep_are_compared(team, experiment):
    member = client_for(team["member"])
    mine = _sweep(member, experiment, [1e-6, 2e-6])
    others = _sweep(member, experiment, [3e-6, 4e-6, 5e-6])  # same experiment, another sweep
    for run_id, value in zip(mine + others, [0.1, 0.2, 0.9, 0.9, 0.9], strict=True):
        metrics_ingest(run_id=run_id, points=[Point("m", 5, value, 0.0)])
        run_transition(run_id=run_id, to="starting")
        run_transition(run_id=run_id, to="running")
    # Counted with the other sweep's runs, 0.1 and 0.2 would be below a median of 0.9; each of my runs
    # has one other run in its sweep (below min_runs): nothing is stopped. The other sweep's runs are
    # all at 0.9: none is worse than its median.
    assert sweeps_early_stop() == []

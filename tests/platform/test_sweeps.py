"""Sweeps (issue 22): the search space, creation (every point validated, nothing stored on a refusal),
ranking by the metric, cancellation, and the launcher's per-sweep admission cap. No engine: metric
points are written directly, run states moved with run_transition."""

from __future__ import annotations

import copy
import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.models import Run, RunState
from experiments.services import run_create, run_transition
from launcher.services import runs_admit
from sweeps import search_space as ss
from sweeps.models import Sweep, SweepRun
from tests.platform.conftest import client_for
from tracking.services import Point, metrics_ingest

# --- the search space (pure) ---------------------------------------------------------------------------


def test_grid_is_the_cartesian_product_of_the_lists_in_sorted_field_order():
    raw = {"trainer.lr": [1e-6, 3e-6], "pipeline.staleness_threshold": [0, 1, 2], "algorithm.x": ["a"]}
    got = ss.points(ss.parse_search_space(raw, "grid"), "grid", n=0, seed=0)
    want = [
        {"algorithm.x": a, "pipeline.staleness_threshold": s, "trainer.lr": lr}
        for a in ["a"]
        for s in [0, 1, 2]
        for lr in [1e-6, 3e-6]
    ]
    assert got == want
    assert ss.parse_search_space(raw, "grid").grid_size() == 6


def test_random_points_are_reproducible_and_within_their_bounds():
    raw = {
        "algorithm.clip_eps_high": "uniform(0.2, 0.3)",
        "trainer.lr": {"loguniform": [1e-6, 1e-4]},
        "trainer.total_steps": {"int": [2, 5]},
        "pipeline.staleness_threshold": [0, 1, 2],
        "rollout.n": {"choice": [2, 4]},
    }
    space = ss.parse_search_space(raw, "random")
    first = ss.points(space, "random", n=200, seed=7)
    assert first == ss.points(space, "random", n=200, seed=7)
    assert first != ss.points(space, "random", n=200, seed=8)
    for p in first:
        assert 0.2 <= p["algorithm.clip_eps_high"] <= 0.3
        assert 1e-6 <= p["trainer.lr"] <= 1e-4
        assert isinstance(p["trainer.total_steps"], int) and 2 <= p["trainer.total_steps"] <= 5
        assert p["pipeline.staleness_threshold"] in (0, 1, 2) and p["rollout.n"] in (2, 4)
    # Every value of the discrete specs shows up, and the int range's both ends.
    assert {p["trainer.total_steps"] for p in first} == {2, 3, 4, 5}
    assert {p["pipeline.staleness_threshold"] for p in first} == {0, 1, 2}
    # loguniform is uniform in log space: about half the draws below the geometric middle.
    below = sum(p["trainer.lr"] < math.sqrt(1e-6 * 1e-4) for p in first)
    assert 60 < below < 140
    # The same draws as a stdlib Random would make, field by field in sorted order (an independent replay).
    rng = random.Random(7)
    replay = {}
    for name in sorted(raw):
        spec = space.fields[name]
        replay[name] = rng.choice(spec.values) if isinstance(spec, ss.Values) else spec.sample(rng)
    assert replay == first[0]


@pytest.mark.parametrize(
    ("raw", "method", "field"),
    [
        ({"trainer.lr": {"uniform": [0.1, 0.2]}}, "grid", "trainer.lr"),
        ({"trainer.lr": "uniform(0.3, 0.2)"}, "random", "trainer.lr"),
        ({"trainer.lr": {"loguniform": [0, 1]}}, "random", "trainer.lr"),
        ({"trainer.lr": {"int": [0.5, 2]}}, "random", "trainer.lr"),
        ({"trainer.lr": []}, "grid", "trainer.lr"),
        ({"trainer.lr": 0.1}, "grid", "trainer.lr"),
        ({"trainer..lr": [1]}, "grid", "trainer..lr"),
        ({"trainer": [{}], "trainer.lr": [1]}, "grid", "trainer.lr"),
        ([], "grid", ""),
    ],
)
def test_bad_specs_name_their_field(raw, method, field):
    with pytest.raises(ss.SearchSpaceError) as exc:
        ss.parse_search_space(raw, method)
    assert [f for f, _ in exc.value.errors] == [field]


# --- the API ---------------------------------------------------------------------------------------------


@pytest.fixture
def member(team):
    return client_for(team["member"])


def _create(client, experiment, **body):
    body = {"experiment": experiment.pk, "metric": "reward/mean", **body}
    return client.post("/api/sweeps", body, format="json")


def _dotted_set(config: dict, path: str, value) -> None:
    *parents, leaf = path.split(".")
    for p in parents:
        config = config[p]
    config[leaf] = value


def test_a_grid_sweep_makes_one_queued_run_per_point_with_its_overrides_and_seed(member, experiment):
    space = {"trainer.lr": [1e-6, 3e-6], "pipeline.staleness_threshold": [0, 1, 2]}
    resp = _create(member, experiment, method="grid", search_space=space, max_concurrent=2, seed=100)
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["state"] == "queued" and body["max_runs"] == 6 and body["run_states"] == {"queued": 6}
    members = list(SweepRun.objects.filter(sweep_id=body["id"]).select_related("run").order_by("index"))
    combos = list(itertools.product([0, 1, 2], [1e-6, 3e-6]))  # sorted fields: pipeline..., trainer.lr
    assert len(members) == len(combos)
    for i, (m, (stale, lr)) in enumerate(zip(members, combos, strict=True)):
        expected = copy.deepcopy(experiment.config)
        _dotted_set(expected, "trainer.lr", lr)
        _dotted_set(expected, "pipeline.staleness_threshold", stale)
        expected["seed"] = 100 + i
        assert m.run.config == expected
        assert m.params == {"pipeline.staleness_threshold": stale, "trainer.lr": lr}
        assert m.seed == 100 + i and m.run.state == RunState.QUEUED
        assert m.run.experiment_id == experiment.pk
    assert {r["index"] for r in body["runs"]} == set(range(6))


@pytest.mark.parametrize(
    ("method", "space", "max_runs"),
    [
        ("grid", {"seed": [3, 7], "trainer.lr": [1e-6, 2e-6]}, None),
        ("grid", {"trainer.lr": [1e-6, 2e-6, 3e-6]}, None),
        ("random", {"seed": {"int": [0, 10**6]}, "trainer.lr": {"loguniform": [1e-6, 1e-4]}}, 4),
        ("random", {"seed": {"choice": [5, 6]}}, 3),
        ("random", {"trainer.lr": {"loguniform": [1e-6, 1e-4]}}, 3),
    ],
)
def test_a_point_that_names_a_seed_keeps_it_and_the_others_get_the_sweeps_seed_plus_their_index(
    member, experiment, method, space, max_runs
):
    """The rule, checked run by run: a point whose search space has a ``seed`` field runs with that seed
    (its own draw or grid value); any other point with the sweep's seed plus its index."""
    body = {"method": method, "search_space": space, "seed": 100, "max_concurrent": 10}
    resp = _create(member, experiment, **body, **({"max_runs": max_runs} if max_runs else {}))
    assert resp.status_code == 201, resp.content
    members = list(
        SweepRun.objects.filter(sweep_id=resp.json()["id"]).select_related("run").order_by("index")
    )
    written_out = _points_written_out(method, space, len(members), seed=100)
    assert len(members) == len(written_out)
    for m, point in zip(members, written_out, strict=True):  # lr: as the config holds it (1e-06)
        assert m.params.keys() == point.keys() and m.params == pytest.approx(point, rel=1e-12), m.index
    for m, point in zip(members, written_out, strict=True):
        want = point["seed"] if "seed" in point else 100 + m.index
        assert m.run.config["seed"] == m.seed == want, (m.index, point)


def _points_written_out(method: str, space: dict, n: int, seed: int) -> list[dict]:
    """The sweep's points by the documented rule, written out here: the grid's Cartesian product of the
    sorted fields (the last varying fastest), or ``n`` draws of ``random.Random(seed)``, field by field
    in sorted order (a list or ``choice``: ``choice``; ``int``: ``randint``; ``loguniform``: ``uniform``
    in log space)."""
    fields = sorted(space)
    if method == "grid":
        return [
            dict(zip(fields, combo, strict=True)) for combo in itertools.product(*(space[f] for f in fields))
        ]
    rng, out = random.Random(seed), []
    for _ in range(n):
        point = {}
        for f in fields:
            spec = space[f]
            if isinstance(spec, list) or "choice" in spec:
                point[f] = rng.choice(spec if isinstance(spec, list) else spec["choice"])
            elif "int" in spec:
                point[f] = rng.randint(*spec["int"])
            else:
                low, high = spec["loguniform"]
                point[f] = math.exp(rng.uniform(math.log(low), math.log(high)))
        out.append(point)
    return out


def test_a_random_sweep_with_the_same_seed_draws_the_same_points(member, experiment):
    space = {"algorithm.clip_eps_high": "uniform(0.2, 0.3)", "trainer.lr": {"loguniform": [1e-6, 1e-4]}}
    a = _create(member, experiment, method="random", search_space=space, max_runs=4, seed=5).json()
    b = _create(member, experiment, method="random", search_space=space, max_runs=4, seed=5).json()
    params = [[m.params for m in SweepRun.objects.filter(sweep_id=s["id"]).order_by("index")] for s in (a, b)]
    assert params[0] == params[1] and len(params[0]) == 4
    assert len({p["trainer.lr"] for p in params[0]}) == 4
    for m in SweepRun.objects.filter(sweep_id=a["id"]).select_related("run"):
        assert m.run.config["trainer"]["lr"] == m.params["trainer.lr"]
        assert m.run.config["algorithm"]["clip_eps_high"] == m.params["algorithm.clip_eps_high"]


@pytest.mark.parametrize(
    ("body", "key", "words"),
    [
        ({"method": "grid", "search_space": {"trainer.lr": [1e-6, -1.0]}}, "search_space.trainer.lr", "point 1"),
        ({"method": "grid", "search_space": {"trainer.nope": [1]}}, "search_space.trainer.nope", "point 0"),
        ({"method": "grid", "search_space": {"trainer.lr": "uniform(0, 1)"}}, "search_space.trainer.lr", "grid"),
        ({"method": "random", "search_space": {"trainer.lr": [1e-6]}}, "max_runs", "max_runs"),
        ({"method": "grid", "search_space": {"trainer.lr": [1e-6, 2e-6]}, "max_runs": 1}, "max_runs", "2 points"),
        ({"method": "grid", "search_space": {"trainer.lr": [1e-6]}, "max_concurrent": 0}, "max_concurrent", ""),
        ({"method": "grid", "search_space": "trainer.lr"}, "search_space", ""),
        ({"method": "grid", "search_space": {"trainer.lr": [1e-6]}, "early_stopping": {"min_steps": -1}},
         "early_stopping.min_steps", ""),
    ],
)  # fmt: skip
def test_a_bad_sweep_is_a_400_at_its_field_and_stores_nothing(member, experiment, body, key, words):
    runs_before = Run.objects.count()
    resp = _create(member, experiment, **body)
    assert resp.status_code == 400, resp.content
    errors = resp.json()["errors"]
    assert key in errors, errors
    assert words in " ".join(map(str, errors[key]))
    assert Sweep.objects.count() == 0 and Run.objects.count() == runs_before


def test_a_viewer_cannot_create_and_a_stranger_does_not_see_the_experiment(team, experiment):
    body = {"method": "grid", "search_space": {"trainer.lr": [1e-6]}}
    assert _create(client_for(team["viewer"]), experiment, **body).status_code == 403
    assert _create(client_for(team["stranger"]), experiment, **body).status_code == 404
    assert Sweep.objects.count() == 0


def _values(run_id: int, values: list[float], start: int = 0) -> None:
    metrics_ingest(
        run_id=run_id,
        points=[Point("reward/mean", start + i, v, 0.0) for i, v in enumerate(values)],
    )


def test_runs_are_ranked_by_last_or_best_value_in_the_goals_direction(member, experiment):
    space = {"trainer.lr": [1e-6, 2e-6, 3e-6, 4e-6, 5e-6]}
    sweep = _create(member, experiment, method="grid", search_space=space, seed=1).json()
    ids = [m.run_id for m in SweepRun.objects.filter(sweep_id=sweep["id"]).order_by("index")]
    series = {ids[0]: [0.1, 0.9, 0.2], ids[1]: [0.5, 0.6], ids[2]: [0.3, 0.4, 0.7, 0.1], ids[3]: [0.8]}
    for run_id, values in series.items():
        _values(run_id, values)
    for summary, goal in itertools.product(["last", "best"], ["max", "min"]):
        Sweep.objects.filter(pk=sweep["id"]).update(goal=goal)
        got = member.get(f"/api/sweeps/{sweep['id']}?summary={summary}").json()
        assert got["ranked_by"] == summary
        # Brute force from the raw series.
        pick = max if goal == "max" else min
        value = {r: (v[-1] if summary == "last" else pick(v)) for r, v in series.items()}
        order = sorted(value, key=lambda r: value[r], reverse=goal == "max")
        assert [r["id"] for r in got["runs"]] == [*order, ids[4]]
        assert [r["rank"] for r in got["runs"]] == [1, 2, 3, 4, None]
        assert [r["value"] for r in got["runs"][:4]] == [value[r] for r in order]
    assert member.get(f"/api/sweeps/{sweep['id']}?summary=median").status_code == 400


def test_cancel_stops_every_unfinished_run_and_the_sweep_state_follows(member, team, experiment):
    space = {"trainer.lr": [1e-6, 2e-6, 3e-6, 4e-6]}
    sweep = _create(member, experiment, method="grid", search_space=space, max_concurrent=2).json()
    ids = [m.run_id for m in SweepRun.objects.filter(sweep_id=sweep["id"]).order_by("index")]
    for run_id, path in zip(
        ids, [["starting", "running", "succeeded"], ["starting", "running"]], strict=False
    ):
        for to in path:
            run_transition(run_id=run_id, to=to)
    assert member.get(f"/api/sweeps/{sweep['id']}").json()["state"] == "running"
    assert client_for(team["viewer"]).post(f"/api/sweeps/{sweep['id']}/cancel").status_code == 403
    resp = member.post(f"/api/sweeps/{sweep['id']}/cancel")
    assert resp.status_code == 200
    states = dict(Run.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert states == {ids[0]: "succeeded", ids[1]: "cancelling", ids[2]: "cancelled", ids[3]: "cancelled"}
    assert resp.json()["state"] == "cancelling"
    run_transition(run_id=ids[1], to=RunState.CANCELLED)
    assert member.get(f"/api/sweeps/{sweep['id']}").json()["state"] == "cancelled"
    assert member.post(f"/api/sweeps/{sweep['id']}/cancel").status_code == 200  # idempotent


def test_list_filters_by_experiment_and_hides_other_projects(member, team, experiment):
    _create(member, experiment, method="grid", search_space={"trainer.lr": [1e-6]})
    listed = member.get(f"/api/sweeps?experiment={experiment.pk}").json()["results"]
    assert len(listed) == 1 and listed[0]["experiment"] == experiment.pk
    assert member.get("/api/sweeps?experiment=999999").json()["results"] == []
    assert client_for(team["stranger"]).get("/api/sweeps").json()["results"] == []


# --- admission: at most max_concurrent of a sweep's runs busy --------------------------------------------


def _busy(run_ids) -> set[int]:
    return set(
        Run.objects.filter(pk__in=run_ids, state__in=["starting", "running", "cancelling"]).values_list(
            "pk", flat=True
        )
    )


def test_admission_keeps_a_sweep_at_its_cap_without_blocking_other_runs(settings, member, experiment):
    settings.RUN_CONCURRENCY_LIMIT = 10
    settings.RUN_CONCURRENCY_LIMIT_PER_PROJECT = 0
    space = {"trainer.lr": [1e-6, 2e-6, 3e-6, 4e-6, 5e-6]}
    sweep = _create(
        member, experiment, method="grid", search_space=space, max_concurrent=2, priority=50
    ).json()
    ids = [m.run_id for m in SweepRun.objects.filter(sweep_id=sweep["id"]).order_by("index")]
    other = run_create(experiment=experiment, user=None, priority=0)  # lower priority, after the sweep
    admitted = runs_admit()
    assert admitted == [ids[0], ids[1], other.pk]  # the sweep's first two by index, then the other run
    assert runs_admit() == []
    # Finish runs one at a time: each freed slot goes to the sweep's next queued run, never a third.
    done = 0
    while done < len(ids):
        busy = sorted(_busy(ids))
        assert len(busy) <= 2
        run_transition(run_id=busy[0], to=RunState.FAILED, error="x")
        done += 1
        expect_next = [i for i in ids if Run.objects.get(pk=i).state == "queued"][:1]
        newly = runs_admit()
        assert newly == expect_next


def test_admission_cap_against_the_rule_with_random_priorities_and_finishes(settings, team, experiment):
    """Several sweeps and plain runs, random priorities, random finishes: after every admission round
    each sweep has at most its cap busy, and no queued run that the rules allowed was left behind."""
    from sweeps.services import SweepSpec, sweep_create

    settings.RUN_CONCURRENCY_LIMIT = 5
    settings.RUN_CONCURRENCY_LIMIT_PER_PROJECT = 0
    rng = random.Random(3)
    caps = {}
    for cap in (1, 2, 3):
        sweep = sweep_create(
            experiment=experiment,
            user=None,
            spec=SweepSpec(
                name=f"s{cap}", method="grid", search_space={"trainer.lr": [1e-6 * k for k in range(1, 5)]},
                metric="m", max_concurrent=cap, priority=rng.randint(-5, 5),
            ),
        )  # fmt: skip
        caps[sweep.pk] = cap
    for _ in range(4):
        run_create(experiment=experiment, user=None, priority=rng.randint(-5, 5))
    sweep_of = dict(SweepRun.objects.values_list("run_id", "sweep_id"))
    for _ in range(40):
        runs_admit()
        rows = list(Run.objects.values_list("pk", "state", "priority", "created_at"))
        busy = [r for r in rows if r[1] in ("starting", "running", "cancelling")]
        per_sweep = {s: sum(1 for r in busy if sweep_of.get(r[0]) == s) for s in caps}
        assert all(per_sweep[s] <= caps[s] for s in caps), per_sweep
        # Independent rule: a queued run left waiting means the global cap is full or its sweep is.
        if len(busy) < 5:
            for pk, state, *_ in rows:
                if state == "queued":
                    assert pk in sweep_of and per_sweep[sweep_of[pk]] == caps[sweep_of[pk]]
        if busy:
            pk = rng.choice(busy)[0]
            state = Run.objects.get(pk=pk).state
            if state == "starting":
                run_transition(run_id=pk, to="running")
            else:
                run_transition(run_id=pk, to=rng.choice(["succeeded", "failed"]), error="x")


# --- early stopping: the median rule ---------------------------------------------------------------------


def _brute_median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _brute_force_losers(series, running, goal, min_steps, min_runs) -> set[int]:
    better = max if goal == "max" else min
    losers = set()
    for r in running:
        if not series[r]:
            continue
        s = max(step for step, _ in series[r])
        if s < min_steps:
            continue
        mine = better(v for step, v in series[r] if step <= s)
        others = [  # the other runs that reached step s, each with a value at or before it
            better(v for step, v in pts if step <= s)
            for o, pts in series.items()
            if o != r and pts and max(step for step, _ in pts) >= s and min(step for step, _ in pts) <= s
        ]
        if len(others) < min_runs:
            continue
        med = _brute_median(others)
        if (mine < med) if goal == "max" else (mine > med):
            losers.add(r)
    return losers


# A run's series: ascending steps, values from a small set (ties and equal medians happen).
SERIES = st.lists(
    st.tuples(st.integers(0, 12), st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 3.0])), max_size=6
).map(lambda points: sorted(dict(points).items()))


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    series=st.dictionaries(st.integers(1, 8), SERIES, max_size=8),
    candidates=st.sets(st.integers(1, 9)),
    goal=st.sampled_from(["max", "min"]),
    min_steps=st.integers(0, 6),
    min_runs=st.integers(1, 4),
)
def test_the_median_rule_is_the_brute_force_rule(series, candidates, goal, min_steps, min_runs):
    """The pure rule against the brute-force one: a candidate is stopped exactly when its best value is
    strictly worse than the median of the *other* runs' bests at its step (itself never counted), and
    the verdict says that median and how many runs it was taken over."""
    from sweeps.early_stopping import median_rule
    from sweeps.services import EarlyStopping

    rule = EarlyStopping(min_steps=min_steps, min_runs=min_runs)
    running = sorted(candidates)
    got = median_rule(series, running, goal=goal, rule=rule)
    assert {v.run_id for v in got} == _brute_force_losers(
        {r: series.get(r, []) for r in {*series, *running}}, running, goal, min_steps, min_runs
    )
    better = max if goal == "max" else min
    for verdict in got:
        step = series[verdict.run_id][-1][0]
        others = [
            better(v for s, v in pts if s <= step)
            for r, pts in series.items()
            if r != verdict.run_id and pts and pts[-1][0] >= step and pts[0][0] <= step
        ]
        assert (verdict.step, verdict.others) == (step, len(others))
        assert verdict.median == _brute_median(others)


@pytest.mark.parametrize(("goal", "seed"), [("max", 1), ("max", 2), ("min", 3), ("min", 4)])
def test_the_median_rule_stops_exactly_the_runs_a_brute_force_count_finds(member, experiment, goal, seed):
    from sweeps.early_stopping import sweeps_early_stop

    rng = random.Random(seed)
    space = {"trainer.lr": [1e-6 * k for k in range(1, 9)]}
    body = _create(
        member, experiment, method="grid", search_space=space, goal=goal,
        early_stopping={"min_steps": 5, "min_runs": 3}, max_concurrent=8,
    ).json()  # fmt: skip
    assert body["early_stopping"] == {"min_steps": 5, "min_runs": 3}
    ids = [m.run_id for m in SweepRun.objects.filter(sweep_id=body["id"]).order_by("index")]
    series = {}
    for i, run_id in enumerate(ids):
        length = rng.choice([0, 3, 8, 12, 20])  # some short of min_steps, some without points
        drift = rng.uniform(-0.05, 0.05)
        values, v = [], rng.uniform(0, 1)
        for _ in range(length):
            v += drift + rng.gauss(0, 0.1)
            values.append(v)
        _values(run_id, values)
        series[run_id] = list(enumerate(values))
        path = ["starting", "running"] + (["succeeded"] if i % 3 == 0 else [])
        for to in path:
            run_transition(run_id=run_id, to=to)
    running = [r for i, r in enumerate(ids) if i % 3 != 0]
    want = _brute_force_losers(series, running, goal, 5, 3)
    stopped = sweeps_early_stop()
    assert set(stopped) == want
    for run_id in ids:
        entry = SweepRun.objects.select_related("run").get(run_id=run_id)
        if run_id in want:
            assert entry.run.state == "cancelling" and entry.early_stopped_at is not None
            assert "median rule" in entry.early_stop_reason
            assert entry.run.events.filter(message__startswith="early-stopped by sweep").exists()
        else:
            assert entry.early_stopped_at is None and entry.run.state in ("running", "succeeded")
    assert sweeps_early_stop() == []  # stopped once
    shown = {r["id"]: r for r in member.get(f"/api/sweeps/{body['id']}").json()["runs"]}
    assert {r for r, row in shown.items() if row["early_stopped_at"]} == want
    assert member.get(f"/api/sweeps/{body['id']}").json()["early_stopped"] == len(want)


def test_a_sweep_without_early_stopping_is_never_stopped(member, experiment):
    from sweeps.early_stopping import sweeps_early_stop

    body = _create(member, experiment, method="grid", search_space={"trainer.lr": [1e-6, 2e-6, 3e-6]}).json()
    ids = [m.run_id for m in SweepRun.objects.filter(sweep_id=body["id"]).order_by("index")]
    for run_id, level in zip(ids, [0.0, 1.0, 2.0], strict=True):
        _values(run_id, [level] * 10)
        run_transition(run_id=run_id, to="starting")
        run_transition(run_id=run_id, to="running")
    assert sweeps_early_stop() == []


def test_a_sweep_walks_its_data_folder_once_whatever_its_number_of_points(
    settings, team, member, tmp_path, monkeypatch
):
    """Every point's config is checked once (run_create takes the sweep's checked config as it is); the
    data folder they all name is walked once per sweep, not twice per point. Counted at os.listdir, the
    walk's one way into a folder."""
    import os

    from tests.factories import ExperimentFactory, demo_config

    data = tmp_path / "data"
    folder = data / "set"
    for sub in ("a", "b", "c"):
        (folder / sub).mkdir(parents=True)
        for i in range(20):
            (folder / sub / f"train-{i}.csv").write_text("question,answer\nq,1\n")
    settings.DATA_ROOTS = [data]
    cfg = demo_config()
    cfg["data"] = {"source": "dataset", "path": str(folder), "columns": {"prompt": "question"}}
    assert client_for(team["member"]).post(
        "/api/experiments", {"project": team["project"].pk, "name": "d", "config": cfg}, format="json"
    ).status_code == 201  # fmt: skip
    experiment = ExperimentFactory(project=team["project"], config=cfg)
    listed: list[str] = []
    real_listdir = os.listdir

    def counting_listdir(path="."):
        listed.append(os.fspath(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", counting_listdir)
    space = {"trainer.lr": [1e-6 * (i + 1) for i in range(20)]}
    resp = _create(member, experiment, method="grid", search_space=space, max_concurrent=2, seed=1)
    assert resp.status_code == 201, resp.content
    assert resp.json()["max_runs"] == 20
    walked = [p for p in listed if p == str(folder)]
    assert len(walked) == 1, f"the folder was listed {len(walked)} times"
    assert sorted(p for p in listed if p.startswith(str(folder))) == sorted(
        [str(folder)] + [str(folder / sub) for sub in ("a", "b", "c")]
    )
    # a second sweep is another request: its own walk
    listed.clear()
    assert _create(member, experiment, method="grid", search_space=space, seed=2).status_code == 201
    assert [p for p in listed if p == str(folder)] == [str(folder)]


@pytest.mark.parametrize("n", [1, 3, 7])
def test_a_sweep_checks_each_points_config_against_the_policy_once(member, experiment, monkeypatch, n):
    """The policy's check runs once per point, n in all for n points (it ran twice per point: the
    sweep's plan, then run_create again), and once per launch outside sweeps. Counted at the check
    itself (``config_violations``)."""
    from experiments import config_policy

    calls: list[float] = []
    real = config_policy.config_violations

    def counted(cfg, **kwargs):
        calls.append(cfg.trainer.lr)
        return real(cfg, **kwargs)

    monkeypatch.setattr(config_policy, "config_violations", counted)
    lrs = [1e-6 * (i + 1) for i in range(n)]
    resp = _create(member, experiment, method="grid", search_space={"trainer.lr": lrs}, seed=5)
    assert resp.status_code == 201, resp.content
    assert sorted(calls) == sorted(lrs)  # each point's config, once
    calls.clear()
    assert member.post("/api/runs", {"experiment": experiment.pk}, format="json").status_code == 201
    assert len(calls) == 1  # a plain launch: the experiment's stored config, checked again, once


def test_a_sweep_over_data_paths_gives_each_run_its_own_resolved_inputs(team, member, tmp_path):
    """Each point's run reads the file its point names: ``Run.inputs`` (where the job reads its data) is
    resolved per point, never the first point's for all. The reference: each file's own path, named
    relative to the working directory as a member types it, resolved by hand here."""
    import os
    from pathlib import Path

    from django.conf import settings as django_settings

    from experiments.models import Experiment
    from tests.factories import demo_config

    root = Path(django_settings.DATA_ROOTS[0])
    root.mkdir(parents=True, exist_ok=True)
    names = [f"sweep-{tmp_path.name}-{i}.jsonl" for i in range(3)]
    for name in names:
        (root / name).write_text('{"prompt": "1+1=", "answer": "2"}\n')
    cfg = demo_config()
    cfg["data"] = {"source": "jsonl", "path": str(root / names[0])}
    experiment = Experiment.objects.create(project=team["project"], name="data sweep", config=cfg)
    workdir = Path(getattr(django_settings, "ENGINE_WORKDIR", "") or django_settings.BASE_DIR)
    typed = [os.path.relpath(root / n, workdir) for n in names]  # relative: the inputs hold the resolved
    resp = _create(member, experiment, method="grid", search_space={"data.path": typed})
    assert resp.status_code == 201, resp.json()
    members = SweepRun.objects.filter(sweep_id=resp.json()["id"]).select_related("run").order_by("index")
    assert len(members) == 3
    for m in members:
        named = m.params["data.path"]
        reads = m.run.inputs["data_path"]
        assert m.run.config["data"]["path"] == named and named in typed
        assert Path(reads) == (workdir / named).resolve(), (named, reads)
    assert len({m.run.inputs["data_path"] for m in members}) == 3

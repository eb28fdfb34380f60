"""Ingestion and queries over HTTP: the wire format the engine's HTTP sink posts, limits, downsampling."""

from __future__ import annotations

import csv
import io
import json

import pytest

from accounts.services import ingest_token_issue
from experiments.models import RunState
from experiments.services import run_create, run_transition
from tests.factories import checkpoint_path
from tests.platform.conftest import client_for
from tracking.models import Checkpoint, MetricPoint
from tracking.selectors import bucket_width, metric_series
from tracking.services import Point, metrics_ingest


@pytest.fixture
def run(team, experiment):
    return run_create(experiment=experiment, user=team["member"])


@pytest.fixture
def engine(run):
    """What the engine holds: its run's ingest token."""
    return client_for(token=ingest_token_issue(run=run).secret)


def points(n: int, key: str = "reward/mean", start: int = 0) -> list[dict]:
    return [{"key": key, "step": s, "value": s / 10, "wall_time": 1.7e9 + s} for s in range(start, start + n)]


@pytest.mark.smoke
def test_engine_reports_metrics_with_its_ingest_token_and_retries_add_nothing(run, engine):
    body = {"points": points(100) + points(50, key="actor/pg_loss")}
    first = engine.post(f"/api/runs/{run.pk}/metrics", body, format="json")
    assert first.status_code == 200 and first.json() == {"received": 150, "inserted": 150}
    retry = engine.post(f"/api/runs/{run.pk}/metrics", body, format="json")
    assert retry.json() == {"received": 150, "inserted": 0}
    assert MetricPoint.objects.filter(run=run).count() == 150


def test_a_batch_over_the_limit_is_413_and_names_the_limit(run, engine):
    resp = engine.post(f"/api/runs/{run.pk}/metrics", {"points": points(5001)}, format="json")
    assert resp.status_code == 413 and "5000" in resp.json()["detail"]
    assert (
        engine.post(f"/api/runs/{run.pk}/metrics", {"points": points(5000)}, format="json").status_code == 200
    )


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"points": [{"key": "k", "step": -1, "value": 1, "wall_time": 0}]}, "points[0].step"),
        ({"points": [{"key": "", "step": 1, "value": 1, "wall_time": 0}]}, "points[0].key"),
        ({"points": [{"key": "k", "step": 1, "value": "high", "wall_time": 0}]}, "points[0].value"),
        ({"points": [{"key": "k", "step": 1, "value": 1}]}, "points[0].wall_time"),
        ({"points": [{"key": "k", "step": 1.5, "value": 1, "wall_time": 0}]}, "points[0].step"),
        ({"points": [{"key": "k", "step": 1, "value": 1, "wall_time": 0, "extra": 1}]}, "points[0].extra"),
        ({"points": "all of them"}, "points"),
        ({}, "points"),
        ([1, 2], "body"),
    ],
)
def test_bad_metric_bodies_are_400_with_field_paths(run, engine, body, path):
    resp = engine.post(f"/api/runs/{run.pk}/metrics", body, format="json")
    assert resp.status_code == 400, resp.content
    assert path in resp.json()["errors"]
    assert not MetricPoint.objects.filter(run=run).exists()


def test_non_finite_json_numbers_are_rejected(run, engine):
    raw = '{"points": [{"key": "k", "step": 1, "value": NaN, "wall_time": 0}]}'
    resp = engine.generic("POST", f"/api/runs/{run.pk}/metrics", raw, content_type="application/json")
    assert resp.status_code == 400


def test_ingest_token_is_bound_to_its_run_and_reads_nothing(team, experiment, run, engine):
    other = run_create(experiment=experiment, user=None)
    assert (
        engine.post(f"/api/runs/{other.pk}/metrics", {"points": points(1)}, format="json").status_code == 404
    )
    assert engine.get(f"/api/runs/{run.pk}/metrics").status_code == 404
    # Authenticated as "the engine of run N", not as a user: everything else is forbidden.
    assert engine.get(f"/api/runs/{run.pk}").status_code == 403
    assert engine.get("/api/experiments").status_code == 403


def test_ingest_tokens_stop_working_when_the_run_ends_or_a_new_one_is_issued(run):
    old = ingest_token_issue(run=run).secret
    new = ingest_token_issue(run=run).secret
    body = {"points": points(1)}
    assert client_for(token=old).post(f"/api/runs/{run.pk}/metrics", body, format="json").status_code == 401
    assert client_for(token=new).post(f"/api/runs/{run.pk}/metrics", body, format="json").status_code == 200
    run_transition(run_id=run.pk, to=RunState.CANCELLED)
    assert client_for(token=new).post(f"/api/runs/{run.pk}/metrics", body, format="json").status_code == 401


def test_metric_query_returns_short_series_whole_and_downsamples_long_ones(team, run):
    pts = [Point("loss", s, 1.0, float(s)) for s in range(10_000)]
    pts[4321] = Point("loss", 4321, 99.0, 4321.0)  # a spike that downsampling must keep
    pts[777] = Point("loss", 777, -5.0, 777.0)
    metrics_ingest(run_id=run.pk, points=pts)
    metrics_ingest(run_id=run.pk, points=[Point("short", s, s * 2.0, 0.0) for s in range(10)])
    viewer = client_for(team["viewer"])
    body = viewer.get(f"/api/runs/{run.pk}/metrics?max_points=200").json()
    by_key = {s["key"]: s for s in body["series"]}
    assert by_key["short"]["steps"] == list(range(10)) and by_key["short"]["values"][3] == 6.0
    assert not by_key["short"]["downsampled"]
    loss = by_key["loss"]
    assert loss["downsampled"] and len(loss["steps"]) <= 200
    assert loss["steps"] == sorted(loss["steps"])
    assert 99.0 in loss["values"] and -5.0 in loss["values"]
    assert loss["steps"][loss["values"].index(99.0)] == 4321
    ranged = viewer.get(
        f"/api/runs/{run.pk}/metrics?keys=loss&step_min=100&step_max=149&max_points=1000"
    ).json()
    assert ranged["series"][0]["steps"] == list(range(100, 150))
    assert viewer.get(f"/api/runs/{run.pk}/metrics/keys").json() == {"keys": ["loss", "short"]}
    assert viewer.get(f"/api/runs/{run.pk}/metrics?max_points=1").status_code == 400


def reference_downsample(
    points: dict[int, float], lo: int, hi: int, max_points: int
) -> list[tuple[int, float]]:
    """Brute force over the same absolute buckets: min (earliest on ties) and max (latest on ties)."""
    width, _ = bucket_width(lo, hi, max_points)
    buckets: dict[int, list[tuple[int, float]]] = {}
    for step in sorted(s for s in points if lo <= s <= hi):
        buckets.setdefault(step // width, []).append((step, points[step]))
    out = []
    for members in buckets.values():
        low = min(members, key=lambda p: (p[1], p[0]))
        high = max(members, key=lambda p: (p[1], p[0]))
        out.extend(sorted({low, high}))
    return out


@pytest.mark.parametrize(
    ("step_min", "step_max", "max_points"),
    [
        (None, None, 100),
        (None, None, 2000),
        (37, 9001, 300),
        (1000, 1999, 50),
        (4095, 70000, 1000),
    ],
)
def test_downsampling_returns_exactly_each_buckets_min_and_max(run, step_min, step_max, max_points):
    """Several batches, a retry with other values (first wins), sparse steps: on PostgreSQL this goes
    through the rollups plus ragged ends, on SQLite through the scan; both must equal brute force."""
    steps = [s for s in range(0, 70_000, 7) if s % 1000 != 3]
    values = {s: float((s * 7919) % 1013) - 500.0 for s in steps}
    for i in range(0, len(steps), 5000):
        metrics_ingest(
            run_id=run.pk, points=[Point("v", s, values[s], float(s)) for s in steps[i : i + 5000]]
        )
    metrics_ingest(run_id=run.pk, points=[Point("v", s, 1e9, 0.0) for s in steps[:3000]])  # ignored retry
    series = metric_series(
        run_id=run.pk, key="v", step_min=step_min, step_max=step_max, max_points=max_points
    )
    inside = [s for s in steps if (step_min is None or s >= step_min) and (step_max is None or s <= step_max)]
    expected = reference_downsample(values, inside[0], inside[-1], max_points)
    assert series.downsampled and len(series.steps) <= max_points
    assert list(zip(series.steps, series.values, strict=True)) == expected
    assert series.wall_times == [float(s) for s in series.steps]


def test_no_max_points_the_api_accepts_ever_returns_more_points_than_that(team, run):
    """Small budgets over short and long, dense and sparse series, whole and in ranges: the answer never
    holds more than max_points points of a series (max_points=2 over steps 1..5 returned three), and
    every point it holds is a stored one (brute-force count and membership)."""
    series = {
        "five": {s: float(s % 3) for s in range(1, 6)},
        "dense": {s: float((s * 37) % 101) for s in range(0, 3000)},
        "sparse": {s: float((s * 13) % 17) for s in range(5, 40_000, 97)},
    }
    for key, values in series.items():
        metrics_ingest(run_id=run.pk, points=[Point(key, s, v, 0.0) for s, v in values.items()])
    viewer = client_for(team["viewer"])
    for key, values in series.items():
        steps = sorted(values)
        for step_min, step_max in [(None, None), (steps[1], steps[-2]), (steps[len(steps) // 3], None)]:
            inside = [
                s
                for s in steps
                if (step_min is None or s >= step_min) and (step_max is None or s <= step_max)
            ]
            for max_points in [2, 3, 4, 5, 6, 7, 9, 16, 33, 100]:
                query = f"keys={key}&max_points={max_points}"
                query += "".join(
                    f"&{n}={v}" for n, v in (("step_min", step_min), ("step_max", step_max)) if v is not None
                )
                got = viewer.get(f"/api/runs/{run.pk}/metrics?{query}").json()["series"][0]
                where = f"{key} {query}"
                assert len(got["steps"]) <= max_points, where
                assert len(got["steps"]) == min(len(inside), len(got["steps"])) and got["steps"] == sorted(
                    got["steps"]
                )
                assert all(values[s] == v for s, v in zip(got["steps"], got["values"], strict=True)), where
                assert set(got["steps"]) <= set(inside), where
                if len(inside) <= max_points:
                    assert got["steps"] == inside and not got["downsampled"], where
                else:  # each bucket keeps its extremes: the range's own min and max survive
                    assert min(values[s] for s in inside) in got["values"], where
                    assert max(values[s] for s in inside) in got["values"], where


def test_events_are_numbered_and_readable_since_a_sequence_number(team, run, engine):
    resp = engine.post(
        f"/api/runs/{run.pk}/events",
        {
            "events": [
                {"kind": "log", "message": "step 1"},
                {"kind": "alert", "message": "reward collapsed", "data": {"reward": 0.0}},
                {
                    "kind": "checkpoint",
                    "message": "saved",
                    "data": {"step": 10, "path": checkpoint_path(run, 10), "size_bytes": 5},
                },
            ]
        },
        format="json",
    )
    assert resp.status_code == 201 and resp.json() == {"received": 3, "last_seq": 4}  # seq 1: queued
    assert list(Checkpoint.objects.filter(run=run).values_list("path", flat=True)) == [
        checkpoint_path(run, 10)
    ]
    viewer = client_for(team["viewer"])
    page = viewer.get(f"/api/runs/{run.pk}/events?after=2").json()
    assert [e["seq"] for e in page["events"]] == [3, 4] and page["last_seq"] == 4
    assert [e["message"] for e in viewer.get(f"/api/runs/{run.pk}/events?kind=alert").json()["events"]] == [
        "reward collapsed"
    ]
    assert viewer.get(f"/api/runs/{run.pk}/events?after=4").json() == {"events": [], "last_seq": 4}
    ckpts = viewer.get(f"/api/runs/{run.pk}/checkpoints").json()
    assert [(c["step"], c["path"]) for c in ckpts] == [(10, checkpoint_path(run, 10))]
    bad = engine.post(f"/api/runs/{run.pk}/events", {"events": [{"kind": "gossip"}]}, format="json")
    assert bad.status_code == 400 and "events[0].kind" in bad.json()["errors"]


def test_heartbeat_says_whether_the_run_is_still_active(run, engine):
    resp = engine.post(f"/api/runs/{run.pk}/heartbeat")
    assert resp.json() == {"active": True, "state": "queued"}
    run.refresh_from_db()
    assert run.heartbeat_at is not None
    member_view = client_for(run.created_by)
    run_transition(run_id=run.pk, to=RunState.FAILED, error="x")
    assert member_view.post(f"/api/runs/{run.pk}/heartbeat").json() == {"active": False, "state": "failed"}


def test_samples_are_stored_capped_and_listed(team, run, engine, settings):
    settings.SAMPLES_PER_STEP_CAP = 2
    body = {
        "samples": [
            {
                "step": 1,
                "prompt": f"p{i}",
                "response": "r",
                "reward": 1.0,
                "version_start": 3,
                "version_end": 4,
            }
            for i in range(3)
        ]
    }
    resp = engine.post(f"/api/runs/{run.pk}/samples", body, format="json")
    assert resp.status_code == 201 and resp.json() == {"received": 3, "stored": 2}
    listed = client_for(team["viewer"]).get(f"/api/runs/{run.pk}/samples?step=1").json()
    assert [(s["prompt"], s["version_start"], s["version_end"]) for s in listed] == [
        ("p0", 3, 4),
        ("p1", 3, 4),
    ]


def test_samples_in_the_engines_shape_are_accepted(team, run, engine):
    """rl_engine's HTTP sink posts {"step", "samples": [{prompt, response, answer, reward, param_version_*}]}."""
    body = {
        "step": 7,
        "samples": [
            {
                "prompt": "ab",
                "response": "ab",
                "answer": "ab",
                "reward": 1.0,
                "param_version_start": 2,
                "param_version_end": 3,
            }
        ],
    }
    assert engine.post(f"/api/runs/{run.pk}/samples", body, format="json").status_code == 201
    [sample] = client_for(team["viewer"]).get(f"/api/runs/{run.pk}/samples").json()
    assert (sample["step"], sample["answer"], sample["version_start"], sample["version_end"]) == (
        7,
        "ab",
        2,
        3,
    )
    no_step = engine.post(
        f"/api/runs/{run.pk}/samples", {"samples": [{"prompt": "a", "response": "b"}]}, format="json"
    )
    assert no_step.status_code == 400 and "no step" in str(no_step.json()["errors"])


def test_a_samples_reward_parts_are_stored_and_listed_and_bad_ones_are_a_400(team, run, engine):
    """Each reward component's score (``reward_parts``) travels with its sample to the sample browser's
    list; a malformed one is refused with the field named, and nothing of the batch is stored."""
    parts = {"reasoning_gym": 1.0, "format": 0.5, "units/rel_err": -0.25}
    body = {"step": 3, "samples": [{"prompt": "p", "response": "r", "reward": 1.05, "reward_parts": parts}]}
    assert engine.post(f"/api/runs/{run.pk}/samples", body, format="json").status_code == 201
    bare = {"step": 3, "samples": [{"prompt": "q", "response": "r", "reward": 1.0}]}
    assert engine.post(f"/api/runs/{run.pk}/samples", bare, format="json").status_code == 201
    listed = client_for(team["viewer"]).get(f"/api/runs/{run.pk}/samples?step=3").json()
    assert [(s["prompt"], s["reward_parts"]) for s in listed] == [("p", parts), ("q", None)]
    bad_parts = [
        {"x": "NaN"},
        {"x": "not a number"},
        {f"c{i}": 1.0 for i in range(33)},
        {"x" * 201: 1.0},
        {"": 1.0},
        ["reasoning_gym", 1.0],
    ]
    for bad in bad_parts:
        body = {"step": 4, "samples": [{"prompt": "p", "response": "r", "reward_parts": bad}]}
        resp = engine.post(f"/api/runs/{run.pk}/samples", body, format="json")
        assert resp.status_code == 400, (bad, resp.content)
        assert any(k.startswith("samples[0].reward_parts") for k in resp.json()["errors"]), resp.json()
    assert not client_for(team["viewer"]).get(f"/api/runs/{run.pk}/samples?step=4").json()


def test_an_episodes_turns_are_stored_and_listed_and_bad_ones_are_a_400(team, run, engine):
    """A multi-turn episode's turns (``turns``: the policy's and the environment's messages in order)
    travel from the engine's example, as its HTTP sink posts it, to the sample browser's list; a malformed
    one is refused with the field named, and nothing of the batch is stored."""
    from rl_engine import wire
    from rl_engine.types import ExampleSample, ExampleTurn

    turns = [
        ExampleTurn("assistant", '<tool_call>{"name": "calculator"}</tool_call>', 17, -0.625),
        ExampleTurn("tool", "84", 9),
        ExampleTurn("assistant", "84", 2, -0.125),
    ]
    example = ExampleSample("what is 12*7?", "...", "84", 1.0, 3, 4, turns=turns).to_dict()
    body = {"samples": [wire.sample(example, 5)]}
    assert engine.post(f"/api/runs/{run.pk}/samples", body, format="json").status_code == 201
    bare = {"step": 5, "samples": [{"prompt": "q", "response": "r"}]}
    assert engine.post(f"/api/runs/{run.pk}/samples", bare, format="json").status_code == 201
    listed = client_for(team["viewer"]).get(f"/api/runs/{run.pk}/samples?step=5").json()
    assert [s["turns"] for s in listed] == [
        [
            {"role": "assistant", "text": turns[0].text, "tokens": 17, "logprob_mean": -0.625},
            {"role": "tool", "text": "84", "tokens": 9, "logprob_mean": None},
            {"role": "assistant", "text": "84", "tokens": 2, "logprob_mean": -0.125},
        ],
        None,
    ]
    ok = {"role": "tool", "text": "84", "tokens": 1}
    bad_turns = [
        [{**ok, "role": "system"}],
        [{**ok, "text": "x" * (wire.MAX_TURN_TEXT + 1)}],
        [{**ok, "tokens": -1}],
        [{**ok, "logprob_mean": "NaN"}],
        [{**ok, "colour": "red"}],
        [{"role": "tool", "text": "84"}],
        [ok] * (wire.MAX_SAMPLE_TURNS + 1),
        {"role": "tool"},
    ]
    for bad in bad_turns:
        body = {"step": 6, "samples": [{"prompt": "p", "response": "r", "turns": bad}]}
        resp = engine.post(f"/api/runs/{run.pk}/samples", body, format="json")
        assert resp.status_code == 400, (bad, resp.content)
        assert any(k.startswith("samples[0].turns") for k in resp.json()["errors"]), resp.json()
    assert not client_for(team["viewer"]).get(f"/api/runs/{run.pk}/samples?step=6").json()


def test_exports_contain_every_point_in_csv_and_in_the_ingestion_shape(team, run):
    metrics_ingest(
        run_id=run.pk,
        points=[Point("a", s, s + 0.5, 100.0 + s) for s in range(1500)] + [Point("b", 0, 0.1, 1.0)],
    )
    viewer = client_for(team["viewer"])
    resp = viewer.get(f"/api/runs/{run.pk}/metrics/export/csv")
    assert resp.status_code == 200 and resp["Content-Type"] == "text/csv"
    rows = list(csv.reader(io.StringIO(b"".join(resp.streaming_content).decode())))
    assert rows[0] == ["key", "step", "value", "wall_time"] and len(rows) == 1502
    assert rows[1] == ["a", "0", "0.5", "100.0"] and rows[-1] == ["b", "0", "0.1", "1.0"]
    data = json.loads(
        b"".join(viewer.get(f"/api/runs/{run.pk}/metrics/export/json?keys=b").streaming_content)
    )
    assert data == {"run": run.pk, "points": [{"key": "b", "step": 0, "value": 0.1, "wall_time": 1.0}]}

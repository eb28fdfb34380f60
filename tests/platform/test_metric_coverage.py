"""A run's stored metric batches, numbered (tracking/coverage.py): what a live follower's poll checks.

- ``Coverage`` against a brute-force reference: batches delivered in any order, some lost; the rows a poll
  must send are exactly those of the lost batches.
- The numbering itself, on the real database: threads ingesting into one run at once (and into another
  run, so that ids interleave) give batches that tile the counter without gaps or overlaps, whose ids
  follow the counter's order and hold exactly their own rows.
"""

from __future__ import annotations

import itertools
import random
import threading

import pytest
from django.db import connection, connections

from experiments.services import run_create
from tracking import live
from tracking.coverage import Coverage, Span, Stored
from tracking.models import MetricPoint, RunProgress
from tracking.services import Point, metrics_ingest


def batches(seed: int, n: int) -> list[tuple[Span, list[int]]]:
    """``n`` consecutive batches of a run with their row ids (ascending, with gaps: other runs' rows)."""
    rng = random.Random(seed)
    out, count, next_id = [], 0, 1
    for _ in range(n):
        ids = []
        for _ in range(rng.randint(1, 6)):
            next_id += rng.randint(1, 3)
            ids.append(next_id)
        out.append((Span(count, count + len(ids), ids[0], ids[-1]), ids))
        count += len(ids)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_the_poll_sends_exactly_the_rows_of_batches_that_did_not_arrive(seed: int) -> None:
    rng = random.Random(1000 + seed)
    history = batches(seed, rng.randint(1, 30))
    connected = rng.randint(0, len(history))  # batches stored before the follower connected
    before = history[:connected]
    start = Stored(count=before[-1][0].end, last_id=before[-1][0].last_id) if before else Stored(0, 0)
    coverage = Coverage(start)
    after = history[connected:]
    arrived = [b for b in after if rng.random() < 0.7]
    rng.shuffle(arrived)  # two web processes publish in any order
    for span, _ in arrived + before[-2:]:  # plus late copies of batches from before connecting
        coverage.add(span)
    now = Stored(count=history[-1][0].end, last_id=history[-1][0].last_id)

    # Brute force: every row after the snapshot, minus those of batches that arrived.
    received = {i for span, ids in arrived for i in ids}
    expected = [i for _, ids in after for i in ids if i not in received]
    assert coverage.behind(now) == bool(expected)
    rows_after = [i for _, ids in after for i in ids]  # the prefix may have grown since a poll read them
    assert coverage.missed(rows_after, now) == expected
    # The prefix only covers batches that arrived: nothing lost lies below it.
    assert all(i > coverage.last_id for i in expected)
    coverage.filled(now)
    assert not coverage.behind(now) and coverage.last_id == now.last_id and not coverage.ahead


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_of_one_run_tile_its_counter_in_id_order(team, experiment, monkeypatch) -> None:
    run = run_create(experiment=experiment, user=team["member"])
    other = run_create(experiment=experiment, user=team["member"])
    spans: dict[int, list[Span]] = {run.pk: [], other.pk: []}
    lock = threading.Lock()

    def record(run_id, payload, *, span=None) -> bool:
        with lock:
            spans[run_id].append(span)
        return True

    monkeypatch.setattr(live, "publish", record)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            for b in range(25):
                for run_id in (run.pk, other.pk):
                    step = 1000 * w + 10 * b
                    # Some points again (a retry): only the new ones count.
                    points = [Point(f"k{k}", s, 1.0, 1.0) for k in range(8) for s in (step, step + 1, 0)]
                    metrics_ingest(run_id=run_id, points=points)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors

    for run_id, got in spans.items():
        got.sort(key=lambda s: s.start)
        rows = list(MetricPoint.objects.filter(run_id=run_id).order_by("id").values_list("id", flat=True))
        assert got[0].start == 0 and got[-1].end == len(rows)
        for a, b in itertools.pairwise(got):
            assert a.end == b.start  # no gap, no overlap
            assert a.last_id < b.first_id  # later in the counter, later ids
        for s in got:  # a span's id range holds exactly its own rows
            assert sum(1 for i in rows if s.first_id <= i <= s.last_id) == s.end - s.start
        progress = RunProgress.objects.get(run_id=run_id)
        assert (progress.points, progress.last_point_id) == (len(rows), rows[-1])
    if connection.vendor == "postgresql":  # the two runs' ids did interleave (the lock is per run)
        a = MetricPoint.objects.filter(run_id=run.pk).values_list("id", flat=True)
        b = MetricPoint.objects.filter(run_id=other.pk).values_list("id", flat=True)
        assert min(a) < max(b) and min(b) < max(a)

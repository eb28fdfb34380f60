"""Writes of the tracking app: idempotent metric ingestion, ordered events, checkpoints, samples.

Every write is stored first and published to the run's live group only after its transaction commits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F
from django.utils import timezone

from experiments.models import Run
from rl_engine import wire
from rl_engine.wire import STOP_GRACE_KEY, EventKind
from tracking import live
from tracking.announcements import EngineAlertStored, announce
from tracking.coverage import Span
from tracking.models import (
    ROLLUP_WIDTHS,
    Checkpoint,
    MetricPoint,
    MetricRollup,
    RunEvent,
    RunProgress,
    Sample,
)


def samples_per_step_cap() -> int:
    return int(getattr(settings, "SAMPLES_PER_STEP_CAP", 32))


@dataclass(frozen=True)
class Point:
    key: str
    step: int
    value: float
    wall_time: float


@dataclass(frozen=True)
class IngestResult:
    received: int
    inserted: int  # points that were new; a retried batch inserts 0


# (id, key, step, value, wall_time) of a stored point
StoredPoint = tuple[int, str, int, float, float]


def _on_commit_publish(run_id: int, payload: wire.LiveMessage, span: Span | None = None) -> None:
    transaction.on_commit(lambda: live.publish(run_id, payload, span=span))


def metrics_ingest(*, run_id: int, points: Sequence[Point]) -> IngestResult:
    """Store a batch of points, idempotent on (run, key, step).

    A point whose (run, key, step) already exists is ignored: **the first value stored wins**, so a
    retried or replayed batch changes nothing (also when a retry carries a different value). Within one
    batch, the first occurrence of a (key, step) wins as well. Only the points actually inserted are
    published to the live stream, so a browser never shows a value the database does not hold.

    A run's batches are stored one at a time (a per-run lock) and counted in ``RunProgress.points``
    in the same transaction; the live message names its batch's ``Span`` (tracking/coverage.py).
    """
    if not points:
        return IngestResult(received=0, inserted=0)
    for p in points:  # the database would store them, but no chart or JSON export can carry them
        if not (math.isfinite(p.value) and math.isfinite(p.wall_time)):
            raise ValueError(f"{p.key}@{p.step}: value and wall_time must be finite numbers")
        if p.step < 0:  # buckets are step // width: steps count from 0
            raise ValueError(f"{p.key}@{p.step}: steps must be >= 0")
    if connection.vendor == "postgresql":
        # One statement stores the points, folds them into the rollups and records the progress: atomic
        # on its own, one round trip (no BEGIN/COMMIT around it).
        with connection.cursor() as cur:
            stored, count = _insert_postgres(cur, run_id, points)
        if stored:  # published now, unless an outer transaction is open
            _on_commit_publish(run_id, _metrics_payload(stored), _span(stored, count))
        return IngestResult(received=len(points), inserted=len(stored))
    # SQLite takes one writer at a time (the database lock, until commit): the per-run order holds.
    with transaction.atomic(), connection.cursor() as cur:
        stored = _insert_sqlite(cur, run_id, points)
        if stored:
            count = _count_sqlite(cur, run_id, stored)
            _on_commit_publish(run_id, _metrics_payload(stored), _span(stored, count))
    return IngestResult(received=len(points), inserted=len(stored))


def _span(stored: Sequence[StoredPoint], count: int) -> Span:
    """The batch ``stored`` as its run's counter moved it to ``count``."""
    ids = [row[0] for row in stored]
    return Span(start=count - len(stored), end=count, first_id=min(ids), last_id=max(ids))


# Engine events that mean "it is moving" (an alert, e.g. the engine's own watchdog, does not).
PROGRESS_EVENT_KINDS = frozenset({EventKind.STATUS, EventKind.CHECKPOINT})


def progress_record(*, run_id: int, step: int | None = None) -> None:
    """The run's engine made progress now (stored metrics of ``step``, or reported a status or a
    checkpoint). One upsert; the highest step is kept. Read by the launcher's stall check."""
    table = RunProgress._meta.db_table
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {table} (run_id, step, at) VALUES (%s, %s, %s) ON CONFLICT (run_id) DO UPDATE SET "
            f"at = excluded.at, step = CASE WHEN excluded.step IS NULL THEN {table}.step "
            f"WHEN {table}.step IS NULL OR excluded.step > {table}.step THEN excluded.step "
            f"ELSE {table}.step END",
            [run_id, step, now],
        )


_SQLITE_ROWS_PER_INSERT = 500  # 5 parameters a row, well under SQLite's 32,766


def _insert_sqlite(cur, run_id: int, points: Sequence[Point]) -> list[StoredPoint]:
    """Multi-row INSERT ... RETURNING (executemany would discard the returned rows)."""
    stored: list[StoredPoint] = []
    for i in range(0, len(points), _SQLITE_ROWS_PER_INSERT):
        chunk = points[i : i + _SQLITE_ROWS_PER_INSERT]
        cur.execute(
            f"INSERT INTO {MetricPoint._meta.db_table} (run_id, key, step, value, wall_time) VALUES "
            + ", ".join(["(%s, %s, %s, %s, %s)"] * len(chunk))
            + " ON CONFLICT (run_id, key, step) DO NOTHING RETURNING id, key, step, value, wall_time",
            [x for p in chunk for x in (run_id, p.key, p.step, p.value, p.wall_time)],
        )
        stored += cur.fetchall()
    return stored


def _count_sqlite(cur, run_id: int, stored: Sequence[StoredPoint]) -> int:
    """Record the progress of the batch ``stored`` (as ``progress_record`` does) and count its points;
    returns the run's counter after it."""
    table = RunProgress._meta.db_table
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    cur.execute(
        f"INSERT INTO {table} (run_id, step, at, points, last_point_id) VALUES (%s, %s, %s, %s, %s) "
        f"ON CONFLICT (run_id) DO UPDATE SET at = excluded.at, "
        f"step = CASE WHEN {table}.step IS NULL OR excluded.step > {table}.step THEN excluded.step "
        f"ELSE {table}.step END, points = {table}.points + excluded.points, "
        f"last_point_id = max(coalesce({table}.last_point_id, 0), excluded.last_point_id) RETURNING points",
        [run_id, max(r[2] for r in stored), now, len(stored), max(r[0] for r in stored)],
    )
    return int(cur.fetchone()[0])


# One statement: take the run's ingest lock, insert the batch (ON CONFLICT keeps the first value), then
# fold exactly the rows that were inserted into the rollups, and record the run's progress (as
# progress_record does) and count its points when any row was new; it returns the rows and the counter.
# The lock (a transaction-level advisory lock on the run, taken before any row exists: the rows are
# joined with it) stores a run's batches one at a time: its ids and its counter follow commit order
# (tracking/coverage.py relies on it), and its rollup and progress rows are never contended.
_PG_INGEST = """
WITH run_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock(%(lock_space)s, %(lock_key)s)),
ins AS (
    INSERT INTO {points} (run_id, key, step, value, wall_time)
    SELECT %(run)s, p->>0, (p->>1)::bigint, (p->>2)::float8, (p->>3)::float8
    FROM run_lock, json_array_elements(%(points)s::json) WITH ORDINALITY AS t(p, i) ORDER BY i
    ON CONFLICT (run_id, key, step) DO NOTHING
    RETURNING id, key, step, value, wall_time
), agg AS (
    SELECT key, width, step / width AS bucket, count(*) AS n,
           min(ARRAY[value, step::float8, wall_time]) AS lo, max(ARRAY[value, step::float8, wall_time]) AS hi
    FROM ins CROSS JOIN unnest(%(widths)s::int[]) AS width
    GROUP BY key, width, step / width
), roll AS (
    INSERT INTO {rollups} AS r (run_id, key, width, bucket, count, min_value, min_step, min_wall_time,
                                max_value, max_step, max_wall_time)
    SELECT %(run)s, key, width, bucket, n, lo[1], lo[2]::bigint, lo[3], hi[1], hi[2]::bigint, hi[3]
    FROM agg ORDER BY key, width, bucket
    ON CONFLICT (run_id, key, width, bucket) DO UPDATE SET
        count = r.count + EXCLUDED.count,
        min_step = CASE WHEN EXCLUDED.min_value < r.min_value THEN EXCLUDED.min_step ELSE r.min_step END,
        min_wall_time = CASE WHEN EXCLUDED.min_value < r.min_value THEN EXCLUDED.min_wall_time
                             ELSE r.min_wall_time END,
        min_value = LEAST(r.min_value, EXCLUDED.min_value),
        max_step = CASE WHEN EXCLUDED.max_value > r.max_value THEN EXCLUDED.max_step ELSE r.max_step END,
        max_wall_time = CASE WHEN EXCLUDED.max_value > r.max_value THEN EXCLUDED.max_wall_time
                             ELSE r.max_wall_time END,
        max_value = GREATEST(r.max_value, EXCLUDED.max_value)
    RETURNING 1
), prog AS (
    INSERT INTO {progress} AS p (run_id, step, at, points, last_point_id)
    SELECT %(run)s, max(step), %(now)s, count(*), max(id) FROM ins HAVING count(*) > 0
    ON CONFLICT (run_id) DO UPDATE SET at = EXCLUDED.at, step = GREATEST(p.step, EXCLUDED.step),
        points = p.points + EXCLUDED.points, last_point_id = GREATEST(p.last_point_id, EXCLUDED.last_point_id)
    RETURNING points
)
SELECT id, key, step, value, wall_time, (SELECT points FROM prog) FROM ins
"""
INGEST_LOCK_SPACE = 0x524C50  # the advisory locks' first key: "RLP" metrics ingestion (the second: the run)


def _insert_postgres(cur, run_id: int, points: Sequence[Point]) -> tuple[list[StoredPoint], int]:
    """The stored rows and the run's counter after them. One statement (the rollups CTE runs to
    completion whether or not its output is read). The batch travels as one JSON text of
    ``[key, step, value, wall_time]`` rows, in order: one parameter quoted by C code, where four arrays
    were quoted element by element in Python (psycopg's client-side binding). Floats are written as
    their shortest repr, which PostgreSQL reads back exactly."""
    cur.execute(
        _PG_INGEST.format(
            points=MetricPoint._meta.db_table,
            rollups=MetricRollup._meta.db_table,
            progress=RunProgress._meta.db_table,
        ),
        {
            "run": run_id,
            "lock_space": INGEST_LOCK_SPACE,
            "lock_key": run_id % 2**31,  # an int4 key (runs 2**31 apart share a lock: harmless)
            "now": timezone.now(),
            "points": json.dumps([(p.key, p.step, p.value, p.wall_time) for p in points], allow_nan=False),
            "widths": list(ROLLUP_WIDTHS),
        },
    )
    rows = cur.fetchall()
    return [row[:5] for row in rows], (int(rows[0][5]) if rows else 0)


def _metrics_payload(stored: Sequence[StoredPoint]) -> wire.MetricsMessage:
    """The live message of newly stored points, each key's in step order (the shape charts consume)."""
    return wire.live_metrics(sorted((row[1:] for row in stored), key=lambda r: (r[0], r[1])))


def event_payload(event: RunEvent) -> wire.EventMessage:
    return wire.live_event(seq=event.seq, kind=event.kind, message=event.message, data=event.data,
                           created=event.created.isoformat())  # fmt: skip


EVENT_KINDS = frozenset(EventKind)


@dataclass(frozen=True)
class NewEvent:
    kind: EventKind
    message: str = ""
    data: dict[str, Any] | None = None


def events_append_many(*, run_id: int, events: Sequence[NewEvent], batch_id: str = "") -> list[RunEvent]:
    """Append events with consecutive per-run sequence numbers.

    The counter lives on the run row: the F() update takes the row lock until commit, so concurrent
    writers get distinct, gap-free ranges in commit order.
    """
    if not events:
        return []
    for e in events:
        if e.kind not in EVENT_KINDS:  # callers are typed; a stray string (a typo) still stops here
            raise ValueError(f"unknown event kind {e.kind!r}; one of {', '.join(EventKind)}")
    with transaction.atomic():
        updated = Run.objects.filter(pk=run_id).update(event_seq=F("event_seq") + len(events))
        if not updated:
            raise Run.DoesNotExist(f"run {run_id} does not exist")
        last = Run.objects.filter(pk=run_id).values_list("event_seq", flat=True).get()
        first = last - len(events) + 1
        rows = RunEvent.objects.bulk_create(
            [
                RunEvent(
                    run_id=run_id,
                    seq=first + i,
                    kind=e.kind,
                    message=e.message,
                    data=e.data or {},
                    batch_id=batch_id,
                )
                for i, e in enumerate(events)
            ]
        )
        for row in rows:
            _on_commit_publish(run_id, event_payload(row))
    return rows


def events_append(
    *, run_id: int, kind: EventKind, message: str, data: dict[str, Any] | None = None
) -> RunEvent:
    return events_append_many(run_id=run_id, events=[NewEvent(kind=kind, message=message, data=data)])[0]


def _lock_run(run_id: int) -> None:
    """Serialise this run's writers until commit (raises Run.DoesNotExist for an unknown run)."""
    Run.objects.select_for_update().filter(pk=run_id).values_list("pk", flat=True).get()


def events_ingest(*, run_id: int, events: Sequence[NewEvent], batch_id: str = "") -> list[RunEvent]:
    """Events sent by the engine. A ``checkpoint`` event whose data has ``step`` and ``path`` also
    records the :class:`Checkpoint` (what resume uses); a status or checkpoint event is engine progress.

    With a ``batch_id`` a re-sent batch (lost reply, sender crash) stores nothing and returns the events
    its first delivery stored: the run row is locked first, so two deliveries of one batch serialise."""
    with transaction.atomic():
        if batch_id:
            _lock_run(run_id)
            stored = list(RunEvent.objects.filter(run_id=run_id, batch_id=batch_id).order_by("seq"))
            if stored:
                return stored
        rows = events_append_many(run_id=run_id, events=events, batch_id=batch_id)
        for row in rows:  # the alerts app decides what becomes an alert (alerts/receivers.py)
            if row.kind == EventKind.ALERT:
                announce(EngineAlertStored(run_id=run_id, seq=row.seq, message=row.message))
        if any(e.kind in PROGRESS_EVENT_KINDS for e in events):
            progress_record(run_id=run_id)
        for e in events:
            data = e.data or {}
            if e.kind == EventKind.CHECKPOINT and "path" in data and "step" in data:
                _checkpoint_upsert(
                    run_id, int(data["step"]), str(data["path"]), int(data.get("size_bytes") or 0)
                )
                if pruned := data.get("pruned"):
                    Checkpoint.objects.filter(run_id=run_id, path__in=list(pruned), pruned_at=None).update(
                        pruned_at=timezone.now()
                    )
            if e.kind == EventKind.STATUS and STOP_GRACE_KEY in data:
                Run.objects.filter(pk=run_id).update(stop_grace_s=float(data[STOP_GRACE_KEY]))
    return rows


def _checkpoint_upsert(run_id: int, step: int, path: str, size_bytes: int) -> Checkpoint:
    ckpt, _ = Checkpoint.objects.update_or_create(
        run_id=run_id, step=step, defaults={"path": path, "size_bytes": size_bytes}
    )
    return ckpt


def checkpoint_record(*, run_id: int, step: int, path: str, size_bytes: int = 0) -> Checkpoint:
    """Record (or update, idempotent on (run, step)) a checkpoint and log a ``checkpoint`` event."""
    with transaction.atomic():
        ckpt = _checkpoint_upsert(run_id, step, path, size_bytes)
        events_append(
            run_id=run_id,
            kind=EventKind.CHECKPOINT,
            message=f"checkpoint at step {step}",
            data={"step": step, "path": path, "size_bytes": size_bytes},
        )
    return ckpt


@dataclass(frozen=True)
class NewSample:
    step: int
    prompt: str
    response: str
    answer: str | None = None
    reward: float | None = None
    version_start: int | None = None
    version_end: int | None = None
    reward_parts: dict[str, float] | None = None
    turns: list[dict[str, Any]] | None = None  # wire.TurnIn's fields, in order


def samples_record(*, run_id: int, samples: Iterable[NewSample], batch_id: str = "") -> int:
    """Store samples, at most ``SAMPLES_PER_STEP_CAP`` per step (extras are dropped). Returns how many
    were stored. The run row is locked so concurrent reporters cannot overshoot the cap. With a
    ``batch_id`` a re-sent batch stores nothing and returns what its first delivery stored."""
    cap = samples_per_step_cap()
    samples = list(samples)
    with transaction.atomic():
        _lock_run(run_id)
        if batch_id and (already := Sample.objects.filter(run_id=run_id, batch_id=batch_id).count()):
            return already
        steps = {s.step for s in samples}
        used = dict(
            Sample.objects.filter(run_id=run_id, step__in=steps)
            .values_list("step")
            .annotate(n=Count("id"))
            .values_list("step", "n")
        )
        keep: list[Sample] = []
        for s in samples:
            if used.get(s.step, 0) >= cap:
                continue
            used[s.step] = used.get(s.step, 0) + 1
            keep.append(
                Sample(
                    run_id=run_id,
                    step=s.step,
                    prompt=s.prompt,
                    response=s.response,
                    answer=s.answer or "",
                    reward=s.reward,
                    version_start=s.version_start,
                    version_end=s.version_end,
                    reward_parts=s.reward_parts,
                    turns=s.turns,
                    batch_id=batch_id,
                )
            )
        Sample.objects.bulk_create(keep)
    return len(keep)


def metrics_batch_store(run_id: int, body: wire.MetricsBody) -> wire.MetricsReply:
    """A validated metrics batch stored: what the view and the ingestion front (tracking/ingest.py) answer."""
    points = [Point(p["key"], p["step"], p["value"], p["wall_time"]) for p in body.points]
    result = metrics_ingest(run_id=run_id, points=points)
    return wire.MetricsReply(received=result.received, inserted=result.inserted)


def samples_batch_store(run_id: int, body: wire.SamplesBody) -> wire.SamplesReply:
    """A validated samples batch stored: what the view and the ingestion front answer."""
    stored = samples_record(
        run_id=run_id,
        samples=[NewSample(**s.model_dump()) for s in body.samples],
        batch_id=body.batch_id or "",
    )
    return wire.SamplesReply(received=len(body.samples), stored=stored)

"""Reads of the tracking app: metric keys, (downsampled) series, events since a sequence number, exports.

Downsampling keeps, for each of ``max_points // 2`` equal-width step buckets, the point with the lowest
and the point with the highest value (spikes survive). On PostgreSQL one GROUP BY does it in the database
(``min``/``max`` over ``ARRAY[value, step, wall_time]`` picks whole points without sorting); elsewhere
the same buckets are computed in Python from a streamed scan.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from django.db import connection

from tracking.models import MetricPoint, RunEvent

DEFAULT_MAX_POINTS = 2000
MAX_MAX_POINTS = 100_000


@dataclass
class Series:
    key: str
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    wall_times: list[float] = field(default_factory=list)
    downsampled: bool = False

    def add(self, step: int, value: float, wall_time: float) -> None:
        self.steps.append(step)
        self.values.append(value)
        self.wall_times.append(wall_time)


def metric_keys(*, run_id: int) -> list[str]:
    return list(
        MetricPoint.objects.filter(run_id=run_id).order_by("key").values_list("key", flat=True).distinct()
    )


def _range_filter(step_min: int | None, step_max: int | None) -> tuple[str, list[int]]:
    sql, params = "", []
    if step_min is not None:
        sql += " AND step >= %s"
        params.append(step_min)
    if step_max is not None:
        sql += " AND step <= %s"
        params.append(step_max)
    return sql, params


def metric_series(
    *, run_id: int, key: str, step_min: int | None = None, step_max: int | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> Series:
    """The points of one key in a step range, ordered by step; at most ``max_points`` of them."""
    table = MetricPoint._meta.db_table
    where, params = _range_filter(step_min, step_max)
    base = [run_id, key, *params]
    with connection.cursor() as cur:
        # Cheap first try: a short series comes back whole (reads at most max_points + 1 index entries).
        cur.execute(
            f"SELECT step, value, wall_time FROM {table} WHERE run_id = %s AND key = %s{where} "
            "ORDER BY step LIMIT %s", [*base, max_points + 1],
        )
        rows = cur.fetchall()
        series = Series(key=key)
        if len(rows) <= max_points:
            for row in rows:
                series.add(*row)
            return series
        cur.execute(f"SELECT min(step), max(step) FROM {table} WHERE run_id = %s AND key = %s{where}", base)
        lo, hi = cur.fetchone()
    buckets = max(max_points // 2, 1)
    span = hi - lo + 1
    series.downsampled = True
    if connection.vendor == "postgresql":
        _downsample_sql(series, table, where, base, lo, span, buckets)
    else:
        _downsample_scan(series, table, where, base, lo, span, buckets)
    return series


def _downsample_sql(series: Series, table: str, where: str, base: list, lo: int, span: int, buckets: int) -> None:
    with connection.cursor() as cur:
        cur.execute(
            f"""
            SELECT b, min(ARRAY[value, step::float8, wall_time]), max(ARRAY[value, step::float8, wall_time])
            FROM (SELECT (step - %s) * %s / %s AS b, step, value, wall_time
                  FROM {table} WHERE run_id = %s AND key = %s{where}) AS t
            GROUP BY b ORDER BY b
            """,
            [lo, buckets, span, *base],
        )
        for _, low, high in cur.fetchall():
            _emit_pair(series, (int(low[1]), low[0], low[2]), (int(high[1]), high[0], high[2]))


def _downsample_scan(series: Series, table: str, where: str, base: list, lo: int, span: int, buckets: int) -> None:
    current = None
    low = high = None
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT step, value, wall_time FROM {table} WHERE run_id = %s AND key = %s{where} ORDER BY step", base
        )
        while chunk := cur.fetchmany(10_000):
            for point in chunk:
                b = (point[0] - lo) * buckets // span
                if b != current:
                    if low is not None:
                        _emit_pair(series, low, high)
                    current, low, high = b, point, point
                    continue
                if point[1] < low[1]:
                    low = point
                if point[1] >= high[1]:  # ties: the later step, as max(ARRAY[...]) does
                    high = point
    if low is not None:
        _emit_pair(series, low, high)


def _emit_pair(series: Series, low: tuple, high: tuple) -> None:
    """Append a bucket's min and max points in step order (once if they are the same point)."""
    first, second = (low, high) if low[0] <= high[0] else (high, low)
    series.add(*first)
    if second[0] != first[0]:
        series.add(*second)


def events_since(*, run_id: int, after: int = 0, limit: int = 500, kinds: list[str] | None = None) -> list[RunEvent]:
    qs = RunEvent.objects.filter(run_id=run_id, seq__gt=after)
    if kinds:
        qs = qs.filter(kind__in=kinds)
    return list(qs.order_by("seq")[:limit])


def metric_rows(*, run_id: int, keys: list[str] | None = None) -> Iterator[tuple[str, int, float, float]]:
    """Every point of a run (optionally some keys), ordered by key then step, streamed in chunks."""
    qs = MetricPoint.objects.filter(run_id=run_id)
    if keys:
        qs = qs.filter(key__in=keys)
    yield from qs.order_by("key", "step").values_list("key", "step", "value", "wall_time").iterator(chunk_size=5000)

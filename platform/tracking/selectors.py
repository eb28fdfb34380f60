"""Reads of the tracking app: metric keys, (downsampled) series, events since a sequence number, exports.

Downsampling keeps, for each of at most ``max_points // 2`` equal-width step buckets, the point with the
lowest and the point with the highest value (spikes survive). Buckets are aligned to absolute steps
(``step // W``). On PostgreSQL the query reads the per-key rollups (min/max per 16, 256, ... steps,
maintained at ingestion) for the whole rollup buckets in range and the raw points only at the two ragged
ends, so its cost follows the number of output points, not the series length. On SQLite the same buckets
come from a streamed scan. Both give identical results (a test checks it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from django.db import connection

from tracking.models import ROLLUP_WIDTHS, MetricPoint, MetricRollup, RunEvent

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
    if connection.vendor == "postgresql":  # the coarsest rollup has a handful of rows per key
        qs = MetricRollup.objects.filter(run_id=run_id, width=ROLLUP_WIDTHS[-1])
    else:
        qs = MetricPoint.objects.filter(run_id=run_id)
    return list(qs.order_by("key").values_list("key", flat=True).distinct())


def _range_filter(step_min: int | None, step_max: int | None) -> tuple[str, list[int]]:
    sql, params = "", []
    if step_min is not None:
        sql += " AND step >= %s"
        params.append(step_min)
    if step_max is not None:
        sql += " AND step <= %s"
        params.append(step_max)
    return sql, params


def bucket_width(lo: int, hi: int, max_points: int) -> tuple[int, int]:
    """(W, w): output buckets are [b*W, (b+1)*W) — aligned to absolute steps so they are unions of
    rollup buckets of width ``w`` (w = 1: no usable rollup). At most max_points // 2 buckets touch
    [lo, hi], so at most max_points points come back (each bucket gives its min and its max)."""
    buckets = max_points // 2 - 1  # one spare: aligned buckets may straddle both ends
    # Room for one bucket only (max_points 2 or 3): it must hold [lo, hi] whole, i.e. start at 0 and be
    # wider than hi (a narrower aligned bucket could split the range in two and return 3 or 4 points).
    target = hi + 1 if buckets < 1 else -(-(hi - lo + 1) // buckets)
    usable = [w for w in ROLLUP_WIDTHS if w <= target]
    w = usable[-1] if usable else 1
    return -(-target // w) * w, w


def metric_series(
    *,
    run_id: int,
    key: str,
    step_min: int | None = None,
    step_max: int | None = None,
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
            "ORDER BY step LIMIT %s",
            [*base, max_points + 1],
        )
        rows = cur.fetchall()
        series = Series(key=key)
        if len(rows) <= max_points:
            for row in rows:
                series.add(*row)
            return series
        cur.execute(f"SELECT min(step), max(step) FROM {table} WHERE run_id = %s AND key = %s{where}", base)
        lo, hi = cur.fetchone()
    width, rollup_width = bucket_width(lo, hi, max_points)
    series.downsampled = True
    if connection.vendor == "postgresql":
        _downsample_sql(series, run_id, key, lo, hi, width, rollup_width)
    else:
        _downsample_scan(series, table, where, base, width)
    return series


def _downsample_sql(
    series: Series, run_id: int, key: str, lo: int, hi: int, width: int, rollup_width: int
) -> None:
    """Whole rollup buckets inside [lo, hi] stand for their points; the partial ones at both ends (at
    most 2 * rollup_width steps) are read from the points themselves."""
    first_full = -(-lo // rollup_width)  # first rollup bucket starting at or after lo
    last_full = (hi + 1) // rollup_width - 1  # last rollup bucket ending at or before hi
    full_lo, full_hi = first_full * rollup_width, (last_full + 1) * rollup_width  # [full_lo, full_hi)
    if rollup_width == 1 or first_full > last_full:
        full_lo = full_hi = hi + 1  # no whole bucket: everything from the points
    sql = f"""
        WITH pts AS (
            SELECT min_value AS value, min_step AS step, min_wall_time AS wall_time FROM {MetricRollup._meta.db_table}
            WHERE run_id = %(run)s AND key = %(key)s AND width = %(w)s AND bucket BETWEEN %(b0)s AND %(b1)s
            UNION ALL
            SELECT max_value, max_step, max_wall_time FROM {MetricRollup._meta.db_table}
            WHERE run_id = %(run)s AND key = %(key)s AND width = %(w)s AND bucket BETWEEN %(b0)s AND %(b1)s
            UNION ALL
            SELECT value, step, wall_time FROM {MetricPoint._meta.db_table}
            WHERE run_id = %(run)s AND key = %(key)s AND step BETWEEN %(lo)s AND %(hi)s
              AND (step < %(full_lo)s OR step >= %(full_hi)s)
        )
        SELECT step / %(W)s AS b, min(ARRAY[value, step::float8, wall_time]), max(ARRAY[value, step::float8, wall_time])
        FROM pts GROUP BY b ORDER BY b
    """
    params = {
        "run": run_id,
        "key": key,
        "w": rollup_width,
        "b0": first_full,
        "b1": last_full,
        "lo": lo,
        "hi": hi,
        "full_lo": full_lo,
        "full_hi": full_hi,
        "W": width,
    }
    with connection.cursor() as cur:
        cur.execute(sql, params)
        for _, low, high in cur.fetchall():
            _emit_pair(series, (int(low[1]), low[0], low[2]), (int(high[1]), high[0], high[2]))


def _downsample_scan(series: Series, table: str, where: str, base: list, width: int) -> None:
    """The portable path (SQLite): the same buckets, computed from a streamed scan of the points."""
    current = None
    low = high = None
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT step, value, wall_time FROM {table} WHERE run_id = %s AND key = %s{where} ORDER BY step",
            base,
        )
        while chunk := cur.fetchmany(10_000):
            for point in chunk:
                b = point[0] // width
                if b != current:
                    if low is not None:
                        _emit_pair(series, low, high)
                    current, low, high = b, point, point
                    continue
                # Ties as in SQL's min/max over ARRAY[value, step]: the earlier step for the min, the later for the max.
                if point[1] < low[1]:
                    low = point
                if point[1] >= high[1]:
                    high = point
    if low is not None:
        _emit_pair(series, low, high)


def _emit_pair(series: Series, low: tuple, high: tuple) -> None:
    """Append a bucket's min and max points in step order (once if they are the same point)."""
    first, second = (low, high) if low[0] <= high[0] else (high, low)
    series.add(*first)
    if second[0] != first[0]:
        series.add(*second)


def events_since(
    *, run_id: int, after: int = 0, limit: int = 500, kinds: list[str] | None = None
) -> list[RunEvent]:
    qs = RunEvent.objects.filter(run_id=run_id, seq__gt=after)
    if kinds:
        qs = qs.filter(kind__in=kinds)
    return list(qs.order_by("seq")[:limit])


def metric_rows(*, run_id: int, keys: list[str] | None = None) -> Iterator[tuple[str, int, float, float]]:
    """Every point of a run (optionally some keys), ordered by key then step, streamed in chunks."""
    qs = MetricPoint.objects.filter(run_id=run_id)
    if keys:
        qs = qs.filter(key__in=keys)
    yield from (
        qs.order_by("key", "step").values_list("key", "step", "value", "wall_time").iterator(chunk_size=5000)
    )

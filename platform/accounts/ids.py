"""Integers and database ids read from a request: a query string, a URL segment, a websocket path.

``str.isdigit()`` accepts "²" (which ``int()`` then refuses: a 500) and Arabic-Indic digits (which
``int()`` reads), ``int()`` also reads " 7", "+7" and "1_0", and an id beyond a bigint overflows in the
database. Every place that turns request text into an id goes through ``parse_db_id``: ASCII digits only, within
1..MAX_DB_ID, else None (the caller answers 400 or 404, or ignores the value; never 500).
"""

from __future__ import annotations

MAX_DB_ID = 2**63 - 1  # a bigint column's largest value (PostgreSQL; SQLite's INTEGER too)
_MAX_DIGITS = 40  # longer digit strings are refused unread (ids have at most 19)
_ASCII_DIGITS = frozenset("0123456789")


def parse_ascii_int(raw: str) -> int | None:
    """``raw`` as an integer when it is an optional ``-`` then ASCII digits (at most 40), else None."""
    digits = raw[1:] if raw.startswith("-") else raw
    if not digits or len(digits) > _MAX_DIGITS or not set(digits) <= _ASCII_DIGITS:
        return None
    return int(raw)


def parse_db_id(raw: str | int | None) -> int | None:
    """``raw`` as a positive database id (1..MAX_DB_ID), or None. Text must be ASCII digits only (no sign,
    no whitespace, no underscore); an int (a URL converter's) must be in range; anything else is None."""
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, str):
        value = parse_ascii_int(raw) if not raw.startswith("-") else None
    elif isinstance(raw, int):
        value = raw
    else:
        return None
    return value if value is not None and 1 <= value <= MAX_DB_ID else None


def parse_db_ids(raw: str, *, limit: int) -> list[int]:
    """A comma-separated list of ids (``?runs=1,2,3``), each item stripped of spaces: the valid ones,
    without repeats, in order, at most ``limit``; anything else is skipped."""
    ids: list[int] = []
    for item in raw.split(","):
        value = parse_db_id(item.strip(" "))
        if value is not None and value not in ids:
            ids.append(value)
            if len(ids) >= limit:
                break
    return ids

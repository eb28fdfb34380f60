"""How the HTTP sink reads the platform's answers: which ones to retry, to wait for, to drop, or to stop on.

| answer | meaning | the sink |
|---|---|---|
| 2xx | stored | moves on |
| 408, 425, 5xx, no answer | the platform or the network is in trouble | retries with backoff (0.25 s doubling up to ``max_backoff_s``) |
| 429 | rate limit | waits ``Retry-After`` (none: the backoff), retries the same batch; never drops it |
| 401 | the token is revoked or expired | re-reads the token file once; if unchanged, stops delivering |
| 403, 404 | this token may not report to this run (or the run is gone) | stops delivering |
| 400, 413, other 4xx | this batch is malformed or too large | splits a 413 in halves; drops the rest, logged locally and reported |
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Mapping
from datetime import UTC
from typing import Any

from rl_engine import wire

_REJECTED_ALERT = "platform rejected a "
MAX_RETRY_AFTER_S = 300.0  # a longer wait is re-asked for after this (the answer says what is left)


class DeliveryRejected(RuntimeError):
    """The platform refused this request for good (malformed, too large): the same body cannot succeed."""

    def __init__(self, status: int, response: Any):
        self.status, self.response = status, response
        super().__init__(f"HTTP {status}: {json.dumps(response)[:300]}")


class AccessRefused(DeliveryRejected):
    """The platform refuses this sink's token for this run (401, 403, 404): no request can succeed."""


class Throttled(OSError):
    """429: retry the same request after ``retry_after_s`` (None: the answer did not say)."""

    def __init__(self, retry_after_s: float | None):
        self.retry_after_s = retry_after_s
        super().__init__(f"HTTP 429 (Retry-After: {retry_after_s})")


def retry_after_s(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (RFC 9110: delay-seconds or an HTTP-date), at least
    1 and at most ``MAX_RETRY_AFTER_S``; None when the header is absent or unreadable."""
    if not value or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # an HTTP-date is GMT
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return min(MAX_RETRY_AFTER_S, max(1.0, seconds))


def classify(status: int, headers: Mapping[str, str], body: bytes) -> Exception:
    """The exception the sink acts on for an HTTP error answer (see the table above)."""
    if status == 429:
        return Throttled(retry_after_s(headers.get("Retry-After")))
    if status >= 500 or status in (408, 425):
        return OSError(f"HTTP {status}")
    response = _read_body(body)
    if status in (401, 403, 404):
        return AccessRefused(status, response)
    return DeliveryRejected(status, response)


def _read_body(raw: bytes) -> Any:
    """The answer's JSON (the platform's ``{"detail", "errors"}``), or its first 2000 characters."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw[:2000].decode(errors="replace")


def rejection_alert(endpoint: str, status: int, response: Any) -> dict[str, Any]:
    """The ``alert`` event that reports a rejected batch on the run's page."""
    data = {"endpoint": endpoint, "status": status, "errors": first_errors(response)}
    return wire.event(wire.EventKind.ALERT, f"{_REJECTED_ALERT}{endpoint} batch: HTTP {status}", data)


def is_rejection_alert(endpoint: str, body: dict[str, Any]) -> bool:
    """Is ``body`` made of rejection alerts only (not to be reported again if refused itself)?"""
    events = body.get(wire.ITEMS[wire.EVENTS], []) if endpoint == wire.EVENTS else []
    return bool(events) and all(
        e.get("kind") == wire.EventKind.ALERT and str(e.get("message", "")).startswith(_REJECTED_ALERT)
        for e in events
    )


def first_errors(response: Any, limit: int = 5) -> dict[str, Any]:
    """The first few field errors of a refusal (``{"events[3].kind": ["..."]}``), for an alert."""
    if isinstance(response, dict):
        errors = response.get("errors")
        if isinstance(errors, dict) and errors:
            return {str(k): _short(v) for k, v in list(errors.items())[:limit]}
        if "detail" in response:
            return {"detail": _short(response["detail"])}
    return {"response": _short(response)}


def _short(value: Any) -> Any:
    if isinstance(value, list):
        return [_short(v) for v in value[:3]]
    return value[:300] if isinstance(value, str) else str(value)[:300]


def bad_item_indices(response: Any, field: str, n_items: int) -> set[int] | None:
    """Indices of the items a 400 names (``points[3].value`` → 3), or None unless every error names an
    item of ``field`` (then only those items are malformed and the rest of the batch can be sent)."""
    errors = response.get("errors") if isinstance(response, dict) else None
    if not isinstance(errors, dict) or not errors:
        return None
    prefix = f"{field}["
    bad: set[int] = set()
    for key in errors:
        head, _, _ = str(key).partition("]")
        if not head.startswith(prefix) or not head[len(prefix) :].isdigit():
            return None
        bad.add(int(head[len(prefix) :]))
    return bad if bad and max(bad) < n_items else None


def with_items(body: dict[str, Any], field: str, items: list[Any], id_suffix: str = "") -> dict[str, Any]:
    """``body`` carrying only ``items``; a part of a split batch gets an id derived from the batch's, so
    a resend (after a crash) splits the same way and the platform still stores each part once."""
    part = {**body, field: items}
    if id_suffix and "batch_id" in body:
        part["batch_id"] = f"{body['batch_id']}{id_suffix}"
    return part

"""Publish stored run data to the run's channel-layer group (``run_<id>``) for live dashboards.

The database is the source of truth; this is a best-effort notification sent after commit. A channel
layer that is down must never fail the request that stored the data, so errors are logged, not raised.
Message: ``{"type": "run.update", "payload": {"kind": "metrics" | "event", ...}}`` (see docs/api.md).
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


def group_name(run_id: int) -> str:
    return f"run_{run_id}"


def publish(run_id: int, payload: dict[str, Any]) -> bool:
    """Send ``payload`` to everyone listening on the run; returns False (and logs) when that failed."""
    try:
        layer = get_channel_layer()
        if layer is None:
            return False
        async_to_sync(layer.group_send)(group_name(run_id), {"type": "run.update", "payload": payload})
        return True
    except Exception:  # a broken channel layer (e.g. Redis down) must not break ingestion
        log.warning("live publish to run_%s failed", run_id, exc_info=True)
        return False

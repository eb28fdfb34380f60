"""Publish stored run data to the run's channel-layer group (``run_<id>``) for live dashboards.

The database is the source of truth; this is a best-effort notification sent after commit. A channel
layer that is down must never fail the request that stored the data, so errors are logged, not raised.
Message: ``{"type": "run.update", "payload": <a live message>}``, the payload built by ``rl_engine.wire``
(``live_metrics`` or ``live_event``; docs/api.md).

Off the request's critical path: in the web server (a sync view running in asgiref's thread, with the
server's event loop running beside it) a publish is handed to that loop and the request goes on at
once; one task per process sends the messages in the order they were published (so a run's events
leave in seq order). The same holds in the threads of the metrics ingestion front (tracking/ingest.py),
which name their server loop with ``bind_loop``. Elsewhere (Celery workers, management commands, the sync test client) it is sent
before ``publish`` returns. Either way a consumer that misses a message (a crash, the layer away) reads
it from the database on its next poll.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

import redis.exceptions
from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer

from rl_engine import wire

log = logging.getLogger(__name__)

QUEUE_MAX = 10_000  # messages waiting for the layer before new ones are dropped (the poll recovers them)
SEND_TIMEOUT_S = 5.0  # one send longer than this counts as failed: the layer is away


def group_name(run_id: int) -> str:
    return f"run_{run_id}"


def publish(run_id: int, payload: wire.LiveMessage) -> bool:
    """Send ``payload`` to everyone listening on the run; returns False (and logs) when that failed, or
    when it could not even be queued for the server's loop."""
    try:
        layer = get_channel_layer()
        if layer is None:
            return False
        message = {"type": "run.update", "payload": payload}
        loop = _server_loop()
        if loop is not None:
            loop.call_soon_threadsafe(_enqueue, loop, layer, group_name(run_id), message)
            return True
        async_to_sync(send)(layer, group_name(run_id), message)
        return True
    except Exception:  # a broken channel layer (e.g. Redis down) must not break ingestion
        log.warning("live publish to run_%s failed", run_id, exc_info=True)
        return False


async def send(layer: Any, group: str, message: dict[str, Any]) -> None:
    """``group_send`` within SEND_TIMEOUT_S, once more if the first attempt's connection was closed under
    it: the layer's pool keeps its connections across a Redis restart, and the first command on each
    fails with ConnectionError ("Connection closed by server") while the next, on a fresh connection,
    succeeds. Without the second try every web process lost its first live message after a restart.

    ``asyncio.timeout`` rather than ``wait_for``: on Python 3.11 ``wait_for`` can swallow a cancellation
    that arrives as the send completes, and the sender task would then outlive its event loop's shutdown."""
    try:
        async with asyncio.timeout(SEND_TIMEOUT_S):
            await layer.group_send(group, message)
    except (redis.exceptions.ConnectionError, ConnectionError):
        async with asyncio.timeout(SEND_TIMEOUT_S):
            await layer.group_send(group, message)


_bound = threading.local()


def bind_loop(loop: asyncio.AbstractEventLoop) -> None:
    """This thread serves requests for the server running ``loop`` (a thread of the ingestion front's
    pool): its publishes are handed to that loop."""
    _bound.loop, _bound.pid = loop, os.getpid()


def _server_loop() -> asyncio.AbstractEventLoop | None:
    """The ASGI server's running event loop when called from a sync view's thread (asgiref records it
    there) or a thread bound to it (``bind_loop``), else None."""
    if (
        getattr(_bound, "pid", None) == os.getpid()
        and _bound.loop.is_running()
        and not _bound.loop.is_closed()
    ):
        return _bound.loop
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    if loop is None or getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None) != os.getpid():
        return None
    if not loop.is_running() or loop.is_closed():
        return None
    try:
        asyncio.get_running_loop()
        return None  # this thread runs a loop itself: not a sync view's thread
    except RuntimeError:
        return loop


# One queue and one sender task per event loop (a process has one server loop).
_queues: dict[asyncio.AbstractEventLoop, asyncio.Queue[tuple[Any, str, dict[str, Any]]]] = {}


def _enqueue(loop: asyncio.AbstractEventLoop, layer: Any, group: str, message: dict[str, Any]) -> None:
    """On the server's loop: queue the message, starting the sender task on first use."""
    queue = _queues.get(loop)
    if queue is None:
        queue = _queues[loop] = asyncio.Queue(QUEUE_MAX)
        loop.create_task(_send_forever(queue), name="live-publish")
    try:
        queue.put_nowait((layer, group, message))
    except asyncio.QueueFull:
        log.warning("live publish queue full (%d): dropping a message to %s", QUEUE_MAX, group)


async def _send_forever(queue: asyncio.Queue[tuple[Any, str, dict[str, Any]]]) -> None:
    while True:
        layer, group, message = await queue.get()
        try:
            await send(layer, group, message)
        except Exception:
            # The layer is away (or too slow): what waits behind this message would only queue up behind
            # more failures and reach consumers late, after the layer is back. Drop it; the consumers'
            # polls read it from the database, and messages published from now on go out as they come.
            dropped = 0
            while not queue.empty():
                queue.get_nowait()
                dropped += 1
            log.warning(
                "live publish to %s failed (%d queued messages left to the consumers' polls)",
                group,
                dropped,
                exc_info=True,
            )

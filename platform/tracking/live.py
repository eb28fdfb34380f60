"""Publish stored run data to the run's live followers (dashboards, ``rlp follow``) through the live bus.

The database is the source of truth; this is a best-effort notification sent after commit. A bus that is
down must never fail the request that stored the data, so errors are logged, not raised. The payload is
built by ``rl_engine.wire`` (``live_metrics``, ``live_event``, ``live_alert``; docs/api.md) and travels as
a ``tracking.bus.Envelope``, encoded once; a metrics message also names the stored batches it carries
(``Span``: tracking/coverage.py), which the followers' polls check against instead of reading the points
back. The publishing process's own followers get it straight from its hub (``LiveHub.deliver``); the bus
carries it to the other processes.

Off the request's critical path: in the web server (a sync view running in a worker thread, with the
server's event loop running beside it) a publish is handed to that loop and the request goes on at once;
each run has an outbox there with one send in flight, which sends its messages in the order they were
published (so a run's events leave in seq order) and merges metrics messages that wait. The server's
loop is recorded by the ASGI application (``bind_server_loop``, config/asgi.py), the ingestion front's
threads name it themselves (``bind_loop``). Elsewhere (Celery workers, management commands, the sync
test client) it is sent before ``publish`` returns. Either way a follower that misses a message (a crash,
the bus away) reads it from the database on its next poll.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rl_engine import wire
from tracking.bus import Envelope, LiveBus, live_bus
from tracking.coverage import Span
from tracking.hub import local_hub

log = logging.getLogger(__name__)

QUEUE_MAX = 10_000  # messages waiting for the bus before new ones are dropped (the poll recovers them)
MERGE_MAX_POINTS = 20_000  # a merged metrics message grows no larger than this


@dataclass
class LiveMessage:
    """A payload on its way out, before it is encoded (waiting metrics messages merge)."""

    run_id: int
    payload: dict[str, Any]  # an rl_engine.wire.LiveMessage
    spans: list[Span]

    def envelope(self, origin: str = "") -> Envelope:
        payload = self.payload
        seq = int(payload["event"]["seq"]) if payload.get("kind") == wire.LiveKind.EVENT else 0
        return Envelope(
            run_id=self.run_id,
            kind=str(payload.get("kind", "")),
            text=json.dumps(payload),
            seq=seq,
            spans=tuple(self.spans),
            origin=origin,
        )

    def merge(self, other: LiveMessage) -> bool:
        """Append ``other``'s points (and spans) when both are metrics messages of the run and the
        result stays under MERGE_MAX_POINTS. Each key keeps its points in order."""
        a, b = self.payload, other.payload
        if a.get("kind") != wire.LiveKind.METRICS or b.get("kind") != wire.LiveKind.METRICS:
            return False
        if a["count"] + b["count"] > MERGE_MAX_POINTS:
            return False
        for key, s in b["series"].items():
            t = a["series"].setdefault(key, {"steps": [], "values": [], "wall_times": []})
            for column in ("steps", "values", "wall_times"):
                t[column].extend(s[column])
        a["count"] += b["count"]
        self.spans.extend(other.spans)
        return True


def publish(run_id: int, payload: wire.LiveMessage, *, span: Span | None = None) -> bool:
    """Send ``payload`` (and the stored batch ``span`` it carries, for metrics) to everyone following
    the run; returns False (and logs) when that failed, or when it could not even be queued for the
    server's loop."""
    message = LiveMessage(run_id, dict(payload), [span] if span is not None else [])
    try:
        bus = live_bus()
        loop = _server_loop()
        if loop is not None:
            loop.call_soon_threadsafe(_enqueue, loop, bus, message)
            return True
        bus.publish_sync(message.envelope())
        return True
    except Exception:  # a broken bus (e.g. Redis down) must not break ingestion
        log.warning("live publish to run %s failed", run_id, exc_info=True)
        return False


# --- which loop serves this thread -------------------------------------------------------------------

_bound = threading.local()
_server: list[tuple[asyncio.AbstractEventLoop, int]] = []  # the ASGI server's loop and its process id


def bind_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    """``loop`` runs this process's ASGI server (config/asgi.py records it on every connection): sync
    views, which run in worker threads beside it, hand their publishes to it."""
    if not _server or _server[0] != (loop, os.getpid()):
        _server[:] = [(loop, os.getpid())]


class ServerLoop:
    """ASGI middleware: records the running loop (``bind_server_loop``) on every connection, then hands
    the connection to ``app``."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        bind_server_loop(asyncio.get_running_loop())
        await self.app(scope, receive, send)


def bind_loop(loop: asyncio.AbstractEventLoop) -> None:
    """This thread serves requests for the server running ``loop`` (a thread of the ingestion front's
    pool): its publishes are handed to that loop."""
    _bound.loop, _bound.pid = loop, os.getpid()


def _usable(loop: asyncio.AbstractEventLoop | None, pid: int | None) -> bool:
    return loop is not None and pid == os.getpid() and loop.is_running() and not loop.is_closed()


def _server_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop to hand a publish to: this thread's own running loop, or the server's when called
    from a thread that serves it; None elsewhere."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass
    loop, pid = getattr(_bound, "loop", None), getattr(_bound, "pid", None)
    if _usable(loop, pid):
        return loop
    if _server:
        loop, pid = _server[0]
        if _usable(loop, pid):
            return loop
    return None


# --- the outbox of each run, on the server's loop ------------------------------------------------------


class Outbox:
    """A run's messages waiting for the bus in one process, with at most one send in flight.

    Consecutive metrics messages merge into one while they wait (up to MERGE_MAX_POINTS points), so
    the publisher sends fewer, larger messages exactly when the bus or the loop is slower than the
    ingestion: the send rate adapts to the answer time instead of a backlog growing, as the engine's
    sink does with its requests. Events are never merged, and nothing is reordered: a run's points still
    leave before the status event published after them."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.messages: collections.deque[tuple[LiveBus, LiveMessage]] = collections.deque()
        self.task: asyncio.Task[None] | None = None

    def add(self, bus: LiveBus, message: LiveMessage) -> bool:
        """Queue ``message`` (merged into the last one where it can be); False when it was dropped."""
        if self.messages and self.messages[-1][0] is bus and self.messages[-1][1].merge(message):
            return True
        if _waiting() >= QUEUE_MAX:
            return False
        self.messages.append((bus, message))
        return True

    async def drain(self) -> None:
        while self.messages:
            bus, message = self.messages.popleft()
            # This process's own followers of the run get the message from here, at once (whatever the
            # bus does); the bus carries it to the other processes.
            hub = local_hub(bus)
            envelope = message.envelope(origin=hub.origin if hub is not None else "")
            if hub is not None:
                hub.deliver(envelope)
            try:
                await bus.publish(envelope)
            except Exception:
                # The bus is away (or too slow): what waits behind this message would only reach other
                # processes' followers late, after the bus is back. Drop it (this process's own
                # followers get it first); the other followers' polls read it from the database, and
                # messages published from now on go out as they come.
                dropped = len(self.messages)
                if hub is not None:
                    for waiting_bus, waiting in self.messages:
                        if waiting_bus is bus:
                            hub.deliver(waiting.envelope(origin=hub.origin))
                self.messages.clear()
                log.warning(
                    "live publish to run %s failed (%d queued messages left to the followers' polls)",
                    self.run_id,
                    dropped,
                    exc_info=True,
                )
        self.task = None  # nothing waits: the outbox goes (the run's next message makes a new one)
        boxes = _outboxes.get(asyncio.get_running_loop())
        if boxes is not None and boxes.get(self.run_id) is self:
            del boxes[self.run_id]


# Per event loop (a process has one server loop): each run's outbox.
_outboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Outbox]] = (
    weakref.WeakKeyDictionary()
)


def _waiting() -> int:
    return sum(len(box.messages) for boxes in _outboxes.values() for box in boxes.values())


def _enqueue(loop: asyncio.AbstractEventLoop, bus: LiveBus, message: LiveMessage) -> None:
    """On the server's loop: queue the message in its run's outbox; start that outbox's sender."""
    boxes = _outboxes.setdefault(loop, {})
    box = boxes.get(message.run_id)
    if box is None:
        box = boxes[message.run_id] = Outbox(message.run_id)
    if not box.add(bus, message):
        log.warning("live publish queue full (%d): dropping a message to run %s", QUEUE_MAX, message.run_id)
        return
    if box.task is None:
        box.task = loop.create_task(box.drain(), name=f"live-publish-{message.run_id}")

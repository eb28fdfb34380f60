"""Publish stored run data to the run's channel-layer group (``run_<id>``) for live dashboards.

The database is the source of truth; this is a best-effort notification sent after commit. A channel
layer that is down must never fail the request that stored the data, so errors are logged, not raised.
Message: ``{"type": "run.update", "group": "run_<id>", "payload": <a live message>}``, the payload built
by ``rl_engine.wire`` (``live_metrics`` or ``live_event``; docs/api.md); a metrics message also names
the stored batches it carries (``"spans"``: tracking/coverage.py), which the followers' polls check
against instead of reading the points back. Each web process's ``tracking.hub.LiveHub`` receives it
once and hands it to that process's followers of the run; with Redis the publishing process's own hub
gets it straight from the outbox, and the layer carries it to the other processes only.

Off the request's critical path: in the web server (a sync view running in asgiref's thread, with the
server's event loop running beside it) a publish is handed to that loop and the request goes on at
once; each run has an outbox there with one send in flight, which sends its messages in the order they
were published (so a run's events leave in seq order) and merges metrics messages that wait. The same
holds in the threads of the ingestion front (tracking/ingest.py), which name their server loop
with ``bind_loop``. Elsewhere (Celery workers, management commands, the sync test client) it is sent
before ``publish`` returns. Either way a consumer that misses a message (a crash, the layer away) reads
it from the database on its next poll.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
import weakref
from typing import Any

import redis.exceptions
from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer

from rl_engine import wire
from tracking.coverage import Span
from tracking.hub import local_hub

log = logging.getLogger(__name__)

QUEUE_MAX = 10_000  # messages waiting for the layer before new ones are dropped (the poll recovers them)
SEND_TIMEOUT_S = 5.0  # one send longer than this counts as failed: the layer is away


def group_name(run_id: int) -> str:
    return f"run_{run_id}"


def layer_message(run_id: int, payload: wire.LiveMessage, span: Span | None = None) -> dict[str, Any]:
    """The channel-layer message carrying ``payload`` to the run's followers; it names its group, which
    the receiving hub routes by (a layer message does not say which group it was sent to), and the
    stored batch a metrics payload holds (``span``: the counter range and ids, as a list of spans, since
    waiting messages merge)."""
    message: dict[str, Any] = {"type": "run.update", "group": group_name(run_id), "payload": payload}
    if span is not None:
        message["spans"] = [span.as_list()]
    return message


def publish(run_id: int, payload: wire.LiveMessage, *, span: Span | None = None) -> bool:
    """Send ``payload`` (and the stored batch ``span`` it carries, for metrics) to everyone listening on
    the run; returns False (and logs) when that failed, or when it could not even be queued for the
    server's loop."""
    try:
        layer = get_channel_layer()
        if layer is None:
            return False
        group, message = group_name(run_id), layer_message(run_id, payload, span)
        loop = _server_loop()
        if loop is not None:
            loop.call_soon_threadsafe(_enqueue, loop, layer, group, message)
            return True
        async_to_sync(send)(layer, group, message)
        return True
    except Exception:  # a broken channel layer (e.g. Redis down) must not break ingestion
        log.warning("live publish to run_%s failed", run_id, exc_info=True)
        return False


async def send(layer: Any, group: str, message: dict[str, Any], *, skip: str | None = None) -> None:
    """``group_send`` within SEND_TIMEOUT_S, once more if the first attempt's connection was closed under
    it: the layer's pool keeps its connections across a Redis restart, and the first command on each
    fails with ConnectionError ("Connection closed by server") while the next, on a fresh connection,
    succeeds. Without the second try every web process lost its first live message after a restart.

    ``asyncio.timeout`` rather than ``wait_for``: on Python 3.11 ``wait_for`` can swallow a cancellation
    that arrives as the send completes, and the sender task would then outlive its event loop's shutdown."""
    try:
        async with asyncio.timeout(SEND_TIMEOUT_S):
            await _group_send(layer, group, message, skip)
    except (redis.exceptions.ConnectionError, ConnectionError):
        async with asyncio.timeout(SEND_TIMEOUT_S):
            await _group_send(layer, group, message, skip)


# What channels-redis' group_send does after reading the group, in one script: for each member channel's
# queue, drop expired messages, then add the message unless the queue is at capacity.
# KEYS: the queues; ARGV: one message per queue, one capacity per queue, now, the message expiry (s).
_ENQUEUE_LUA = """
local n = #KEYS
local now = tonumber(ARGV[2 * n + 1])
local expiry = tonumber(ARGV[2 * n + 2])
local over = 0
for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, math.floor(now) - expiry)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[n + i]) then
        redis.call('ZADD', KEYS[i], now, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over = over + 1
    end
end
return over
"""


async def _group_send(layer: Any, group: str, message: dict[str, Any], skip: str | None = None) -> None:
    """``layer.group_send``; on channels-redis in two round trips instead of four, to every member but
    ``skip`` (this process's hub, which got the message directly), and in one when no other is left.

    channels-redis sends to a group in four commands one after the other (drop the group's expired
    members, read the members, drop each queue's expired messages, then a script that enqueues), each
    waiting for the event loop; under a sweep's load that loop is the web process's busiest thread. Here
    the first two go in one pipeline and the last two in one script (cached by Redis: EVALSHA), with the
    same keys, messages, capacities and expiries, so any channels-redis receiver reads them as its own."""
    if not isinstance(layer, RedisChannelLayer):
        await layer.group_send(group, message)
        return
    key = layer._group_key(group)
    connection = layer.connection(layer.consistent_hash(group))
    pipe = connection.pipeline(transaction=False)
    pipe.zremrangebyscore(key, min=0, max=int(time.time()) - layer.group_expiry)
    pipe.zrange(key, 0, -1)
    _, members = await pipe.execute()
    channels = [name for name in (m.decode("utf8") for m in members) if name != skip]
    by_connection, messages, capacities = layer._map_channel_keys_to_connection(channels, message)
    for index, keys in by_connection.items():
        queue_connection = layer.connection(index)
        enqueue = queue_connection.register_script(_ENQUEUE_LUA)
        args = [messages[k] for k in keys] + [capacities[k] for k in keys] + [time.time(), layer.expiry]
        over = await enqueue(keys=keys, args=args)
        if over:
            log.info("%d of %d channels over capacity in group %s", over, len(channels), group)


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


class Outbox:
    """A run's messages waiting for the layer in one process, with at most one send in flight.

    Consecutive metrics messages merge into one while they wait (up to MERGE_MAX_POINTS points), so
    the publisher sends fewer, larger messages exactly when the layer or the loop is slower than the
    ingestion: the send rate adapts to the answer time instead of a backlog growing, as the engine's
    sink does with its requests. Events are never merged, and nothing is reordered: a run's points still
    leave before the status event published after them."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.messages: collections.deque[tuple[Any, dict[str, Any]]] = collections.deque()  # (layer, message)
        self.task: asyncio.Task[None] | None = None

    def add(self, layer: Any, message: dict[str, Any]) -> bool:
        """Queue ``message`` (merged into the last one where it can be); False when it was dropped."""
        if self.messages and self.messages[-1][0] is layer and _merge_metrics(self.messages[-1][1], message):
            return True
        if _waiting() >= QUEUE_MAX:
            return False
        self.messages.append((layer, message))
        return True

    async def drain(self) -> None:
        while self.messages:
            layer, message = self.messages.popleft()
            # With Redis, this process's own followers of the run get the message from here, at once
            # (whatever Redis does); the layer carries it to the other processes. The in-process layer
            # carries everything itself.
            hub = local_hub(layer) if isinstance(layer, RedisChannelLayer) else None
            if hub is not None:
                hub.deliver(message)
            try:
                await send(layer, self.group, message, skip=hub.channel if hub is not None else None)
            except Exception:
                # The layer is away (or too slow): what waits behind this message would only reach
                # other processes' consumers late, after the layer is back. Drop it (this process's own
                # followers get it first); the other consumers' polls read it from the database, and
                # messages published from now on go out as they come.
                dropped = len(self.messages)
                if hub is not None:
                    for waiting_layer, waiting in self.messages:
                        if waiting_layer is layer:
                            hub.deliver(waiting)
                self.messages.clear()
                log.warning(
                    "live publish to %s failed (%d queued messages left to the consumers' polls)",
                    self.group,
                    dropped,
                    exc_info=True,
                )
        self.task = None  # nothing waits: the outbox goes (the run's next message makes a new one)
        boxes = _outboxes.get(asyncio.get_running_loop())
        if boxes is not None and boxes.get(self.group) is self:
            del boxes[self.group]


MERGE_MAX_POINTS = 20_000  # a merged metrics message grows no larger than this


def _merge_metrics(into: dict[str, Any], message: dict[str, Any]) -> bool:
    """Append ``message``'s points (and its spans) to ``into`` when both are metrics messages (``into``
    was built by this process's publish and not sent yet: it is changed in place). Each key keeps its
    points in order."""
    a, b = into["payload"], message["payload"]
    if a.get("kind") != wire.LiveKind.METRICS or b.get("kind") != wire.LiveKind.METRICS:
        return False
    if a["count"] + b["count"] > MERGE_MAX_POINTS:
        return False
    for key, s in b["series"].items():
        t = a["series"].setdefault(key, {"steps": [], "values": [], "wall_times": []})
        for column in ("steps", "values", "wall_times"):
            t[column].extend(s[column])
    a["count"] += b["count"]
    if "spans" in message:
        into.setdefault("spans", []).extend(message["spans"])
    return True


# Per event loop (a process has one server loop): each run's outbox.
_outboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Outbox]] = (
    weakref.WeakKeyDictionary()
)


def _waiting() -> int:
    return sum(len(box.messages) for boxes in _outboxes.values() for box in boxes.values())


def _enqueue(loop: asyncio.AbstractEventLoop, layer: Any, group: str, message: dict[str, Any]) -> None:
    """On the server's loop: queue the message in its run's outbox; start that outbox's sender."""
    boxes = _outboxes.setdefault(loop, {})
    box = boxes.get(group)
    if box is None:
        box = boxes[group] = Outbox(group)
    if not box.add(layer, message):
        log.warning("live publish queue full (%d): dropping a message to %s", QUEUE_MAX, group)
        return
    if box.task is None:
        box.task = loop.create_task(box.drain(), name=f"live-publish-{group}")

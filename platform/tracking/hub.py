"""The live fan-out of one web process: one channel-layer membership per followed run, not per socket.

Channels' default gives every websocket consumer its own layer channel and group membership. With
channels-redis every consumer of a process then waits on the layer in turn (one lock per process, two
asyncio tasks per waiting consumer and wake-up) and encodes every message to JSON itself. Under a sweep's
load (20 runs logging every 40 ms, 100 followers on one process) the process read its layer channel
slower than messages arrived: the backlog in Redis grew for the whole run, and four points in five
reached the browsers through the consumers' 10-second database poll instead (docs/benchmarks.md).

Here a ``LiveHub`` (one per event loop and channel layer) owns one layer channel. It joins ``run_<id>``
when the first local follower of that run subscribes and leaves when the last one goes; one reader task
receives each message once, encodes its payload to JSON once and puts it in every subscriber's inbox,
where the consumer's own dispatch loop takes it (``RunConsumer.channel_receive``). Messages carry their
group (``tracking.live.publish`` adds it), since a layer message does not say which group it came from.

The hub also owns the layer's failures: when a receive fails (Redis away) it marks itself down, retries
joining every group with a backoff (a restarted Redis forgot them), and then tells every subscriber to
read what it missed (``live.resync``). Consumers poll the database faster while the hub is down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from typing import Any

from channels_redis.core import RedisChannelLayer

log = logging.getLogger(__name__)

INBOX_MAX = 1000  # messages a consumer may fall behind by; beyond, new ones wait for its database poll
RETRY_MIN_S = 0.5  # first wait before joining the groups again after the layer failed
RETRY_MAX_S = 5.0  # longest wait between two attempts
RECEIVE_BATCH = 500  # messages taken from the layer in one read


class Inbox:
    """What the hub delivers to one consumer: layer messages, in order, with their JSON text."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(INBOX_MAX)
        self.overflowing = False  # a message was dropped and none delivered since (logged once)

    def put(self, message: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(message)
            self.overflowing = False
        except asyncio.QueueFull:
            if not self.overflowing:
                log.warning(
                    "a live follower is %d messages behind: dropping (its poll reads them)", INBOX_MAX
                )
            self.overflowing = True

    async def get(self) -> dict[str, Any]:
        return await self.queue.get()


class LiveHub:
    """One layer channel per process (event loop) and layer, shared by every local follower."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.channel: str | None = None
        self.subscribers: dict[str, set[Inbox]] = {}  # group -> local inboxes
        self.up = False  # the last layer operation succeeded
        self._reader: asyncio.Task[None] | None = None

    async def subscribe(self, group: str, inbox: Inbox) -> bool:
        """Deliver ``group``'s messages to ``inbox`` from now on; False when the layer is unreachable
        (the subscription stands: the hub joins the group once the layer is back)."""
        if self.channel is None:
            self.channel = await self.layer.new_channel()
        first = group not in self.subscribers
        self.subscribers.setdefault(group, set()).add(inbox)
        joined = await self.join(group) if first or not self.up else True
        if self._reader is None or self._reader.done():  # started after the join: it finds the layer up
            self._reader = asyncio.get_running_loop().create_task(self._read_forever(), name="live-hub")
        return joined

    async def unsubscribe(self, group: str, inbox: Inbox) -> None:
        inboxes = self.subscribers.get(group)
        if inboxes is None or inbox not in inboxes:
            return
        inboxes.discard(inbox)
        if inboxes:
            return
        del self.subscribers[group]
        if self.up and self.channel is not None:
            try:
                await self.layer.group_discard(group, self.channel)
            except Exception:  # an unreachable layer forgets the membership anyway
                self.up = False
        if not self.subscribers and self._reader is not None:
            self._reader.cancel()  # nothing to read for (the next subscriber starts a reader again)
            self._reader = None

    async def join(self, group: str) -> bool:
        """Join ``group`` (again: idempotent). A restarted Redis forgot every membership, and one that
        restarted unnoticed (redis-py reconnects silently) too: the consumers' polls call this."""
        assert self.channel is not None
        try:
            await self.layer.group_add(group, self.channel)
        except Exception:
            self.up = False
            return False
        self.up = True
        return True

    async def _rejoin_all(self) -> bool:
        for group in list(self.subscribers):
            if not await self.join(group):
                return False
        return True

    async def _read_forever(self) -> None:
        assert self.channel is not None
        delay = RETRY_MIN_S
        while self.subscribers:
            if not self.up:
                if not await self._rejoin_all():
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
                    continue
                delay = RETRY_MIN_S
                log.info("channel layer reachable again: %d runs followed", len(self.subscribers))
                for inboxes in list(self.subscribers.values()):
                    for inbox in list(inboxes):
                        inbox.put({"type": "live.resync"})
            try:
                messages = await self._receive_batch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("channel layer lost (%r): live followers read the database meanwhile", exc)
                self.up = False
                continue
            self.up = True
            for message in messages:
                self.deliver(message)

    async def _receive_batch(self) -> list[dict[str, Any]]:
        """The next messages for the hub's channel, in the order they were sent.

        channels-redis' ``receive`` takes one message per call, in four commands one after the other (a
        clean-up script, the blocking pop, a backup copy, its removal); on a web process busy with 100
        sockets each command waits for the event loop, and the hub fell behind at ~25 messages a second
        (docs/benchmarks.md). For that layer the hub reads its process's queue itself: one blocking pop,
        then whatever else waits (up to RECEIVE_BATCH) in one more command. Messages are ordered by send
        time as the layer's own receive orders them. The layer's backup queue (which re-delivers a
        message whose receiver was cancelled mid-way) is not used: a follower that misses a message
        reads it from the database on its next poll. The queue is the layer's for the whole process, so
        this assumes one hub reads it: one server event loop per process, as uvicorn and daphne run.
        Other layers (the embedded default's in-memory one) are read through ``receive``."""
        layer = self.layer
        if not isinstance(layer, RedisChannelLayer):
            return [await layer.receive(self.channel)]
        local = layer.non_local_name(self.channel)  # the process's queue: "specific.<process id>!"
        key = layer.prefix + local
        connection = layer.connection(layer.consistent_hash(local))
        first = await connection.bzpopmin(key, timeout=layer.brpop_timeout)
        if first is None:
            return []
        raw = [first[1]] + [member for member, _ in await connection.zpopmin(key, RECEIVE_BATCH - 1)]
        messages = []
        for data in raw:
            message = layer.deserialize(data)
            message.pop("__asgi_channel__", None)  # the hub's channel (this process has no other reader)
            messages.append(message)
        return messages

    def deliver(self, message: dict[str, Any]) -> None:
        """Hand a message to this process's followers of its run: one read from the layer, or one this
        process publishes (``tracking.live`` hands it here and leaves this hub's channel out of the
        layer's send). One bad message is logged and dropped: it must not stop the live stream."""
        try:
            self._dispatch(message)
        except Exception:
            log.warning("live message to %s dropped", message.get("group"), exc_info=True)

    def _dispatch(self, message: dict[str, Any]) -> None:
        inboxes = self.subscribers.get(message.get("group", ""))
        if not inboxes:
            return  # the last local follower left while the message was on its way
        if message.get("type") == "run.update" and "payload" in message:
            message = {**message, "text": json.dumps(message["payload"])}  # once, for every follower
        for inbox in list(inboxes):
            inbox.put(message)


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, LiveHub]] = weakref.WeakKeyDictionary()


def local_hub(layer: Any) -> LiveHub | None:
    """The running event loop's hub for ``layer`` when it has a layer channel, else None (no follower
    ever subscribed in this process)."""
    hub = _hubs.get(asyncio.get_running_loop(), {}).get(id(layer))
    return hub if hub is not None and hub.layer is layer and hub.channel is not None else None


def hub_for(layer: Any) -> LiveHub:
    """The hub of the running event loop for ``layer`` (settings may swap the layer: tests do)."""
    hubs = _hubs.setdefault(asyncio.get_running_loop(), {})
    hub = hubs.get(id(layer))
    if hub is None or hub.layer is not layer:
        hub = hubs[id(layer)] = LiveHub(layer)
    return hub

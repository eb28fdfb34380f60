"""The live bus: how a stored run's live messages reach every web process that has a follower of the run.

One small interface (``LiveBus``: publish an envelope; ``BusReader``: one process's subscription, read in
batches) with two implementations, chosen by settings (``live_bus()``):

- ``MemoryBus`` (the embedded default): within one process. A message published in a Celery worker does
  not reach the web process; there the consumers' database poll carries it (every 1.5 s).
- ``RedisBus`` (the production stack): Redis pub/sub on channels of this project's own
  (``<prefix>:live:<run id>``), through redis-py's public API. A web process holds one subscription
  connection (its ``LiveHub``'s reader) with one channel per followed run; a publish is one ``PUBLISH``.
  Pub/sub keeps nothing: a message sent while a reader is away is gone, which is fine because the
  database is the source of truth and a reader that comes back tells its followers to read what they
  missed (``tracking.hub``). A reader that falls too far behind is disconnected by Redis
  (``client-output-buffer-limit pubsub``) and recovers the same way.

Channels' layer is not used for live data: the consumers read their inbox themselves (tracking/consumers.py).

An envelope carries its payload already encoded as JSON (``text``): the publisher encodes it once and every
follower in every process sends those bytes as they are. What the receiving side needs to route and order
it (run, kind, an event's seq, a metrics message's stored batches) travels beside it in a small header.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis
import redis.asyncio
from django.conf import settings
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from tracking.coverage import Span

log = logging.getLogger(__name__)

SOCKET_TIMEOUT_S = 5.0  # one command longer than this failed: the bus is away
CONNECT_TIMEOUT_S = 5.0
LISTEN_TIMEOUT_S = 5.0  # a subscription Redis has not confirmed by then failed
HEALTH_S = 1.0  # default of settings.LIVE_BUS_SILENT_S: a reader that heard nothing for this long pings
# Redis, and one whose ping is not answered within as long again gives the bus up (its hub's followers
# read the database meanwhile). Its hub reads only while followers wait, so this costs one PING a second
# per idle web process; 5 s (and 5 s more for the answer) left a paused Redis unnoticed for up to 10 s.
RECEIVE_BATCH = 500  # envelopes taken in one receive


def silent_bound_s() -> float:
    """How long a reader may hear nothing from Redis before it pings, and wait for the answer
    (``settings.LIVE_BUS_SILENT_S``)."""
    return float(getattr(settings, "LIVE_BUS_SILENT_S", HEALTH_S))


class BusUnavailable(Exception):
    """The bus did not take or deliver a message (Redis away, or too slow)."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """One live message of a run, as it travels between processes.

    ``text`` is the payload (an ``rl_engine.wire.LiveMessage``) as JSON; ``kind`` its ``kind``; ``seq``
    an event's sequence number (0 otherwise); ``spans`` the stored batches a metrics payload carries
    (tracking/coverage.py); ``origin`` the hub that already delivered it in the publishing process (its
    reader skips it), "" when none did."""

    run_id: int
    kind: str
    text: str
    seq: int = 0
    spans: tuple[Span, ...] = ()
    origin: str = ""

    def encode(self) -> str:
        header = [self.run_id, self.kind, self.seq, [s.as_list() for s in self.spans], self.origin]
        return json.dumps(header, separators=(",", ":")) + "\n" + self.text

    @classmethod
    def decode(cls, data: bytes | str) -> Envelope:
        """The envelope ``encode`` wrote; ValueError (or a subclass) for anything else."""
        raw = data.decode("utf8") if isinstance(data, bytes) else data
        head, sep, text = raw.partition("\n")
        if not sep:
            raise ValueError("a live envelope has a header line")
        run_id, kind, seq, spans, origin = json.loads(head)
        return cls(
            run_id=int(run_id),
            kind=str(kind),
            text=text,
            seq=int(seq),
            spans=tuple(Span(*(int(v) for v in s)) for s in spans),
            origin=str(origin),
        )


class BusReader(Protocol):
    """One process's subscription (one per ``LiveHub``); only the hub's reader task calls ``receive``
    and ``reopen``, while ``listen`` and ``unlisten`` may come from other tasks of the same loop."""

    async def reopen(self, run_ids: set[int]) -> None:
        """(Re)connect and listen to ``run_ids``; raises ``BusUnavailable`` when that failed."""

    async def listen(self, run_id: int) -> None:
        """Receive ``run_id``'s envelopes from now on (once the bus confirmed it, for a remote bus);
        raises ``BusUnavailable``."""

    async def unlisten(self, run_id: int) -> None: ...

    async def receive(self) -> list[Envelope]:
        """The next envelopes (at least one; in the order they were published), waiting for them;
        raises ``BusUnavailable`` when the bus went away."""

    async def close(self) -> None: ...


class LiveBus(Protocol):
    name: str  # "memory" or "redis" (the health endpoint reports it)

    def reader(self) -> BusReader:
        """A new subscription for a hub on the running event loop."""

    async def publish(self, envelope: Envelope) -> None:
        """Send ``envelope`` to every reader listening to its run; raises ``BusUnavailable``."""

    def publish_sync(self, envelope: Envelope) -> None:
        """``publish`` from a thread without an event loop of the platform's (a Celery worker, a command)."""

    async def listeners(self, run_id: int) -> int:
        """How many readers (web processes) listen to ``run_id`` now."""


# --- in process -----------------------------------------------------------------------------------------


class MemoryReader:
    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Envelope] = asyncio.Queue()
        self.runs: set[int] = set()

    def offer(self, envelope: Envelope) -> None:
        """From any thread: queue ``envelope`` if this reader listens to its run."""
        if envelope.run_id not in self.runs or self.loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.queue.put_nowait(envelope)
            return
        with contextlib.suppress(RuntimeError):  # the reader's loop closed meanwhile
            self.loop.call_soon_threadsafe(self.queue.put_nowait, envelope)

    async def reopen(self, run_ids: set[int]) -> None:
        self.runs = set(run_ids)
        self.bus.attach(self)

    async def listen(self, run_id: int) -> None:
        self.runs.add(run_id)
        self.bus.attach(self)

    async def unlisten(self, run_id: int) -> None:
        self.runs.discard(run_id)

    async def receive(self) -> list[Envelope]:
        batch = [await self.queue.get()]
        while len(batch) < RECEIVE_BATCH and not self.queue.empty():
            batch.append(self.queue.get_nowait())
        return batch

    async def close(self) -> None:
        self.bus.detach(self)


class MemoryBus:
    """Readers of this process only; publishing never fails."""

    name = "memory"

    def __init__(self) -> None:
        self._readers: weakref.WeakSet[MemoryReader] = weakref.WeakSet()
        self._lock = threading.Lock()

    def attach(self, reader: MemoryReader) -> None:
        with self._lock:
            self._readers.add(reader)

    def detach(self, reader: MemoryReader) -> None:
        with self._lock:
            self._readers.discard(reader)

    def reader(self) -> MemoryReader:
        return MemoryReader(self)

    async def publish(self, envelope: Envelope) -> None:
        self.publish_sync(envelope)

    def publish_sync(self, envelope: Envelope) -> None:
        with self._lock:
            readers = list(self._readers)
        for reader in readers:
            reader.offer(envelope)

    async def listeners(self, run_id: int) -> int:
        with self._lock:
            return sum(run_id in reader.runs for reader in self._readers)


# --- Redis pub/sub --------------------------------------------------------------------------------------


@dataclass
class RedisReader:
    """One pub/sub connection. Failures surface (no silent reconnect: redis-py's retries are off) so that
    the hub knows it may have missed messages; it then reopens the reader, which subscribes afresh."""

    bus: RedisBus
    client: redis.asyncio.Redis | None = None
    pubsub: Any = None  # redis.asyncio.client.PubSub
    confirming: dict[str, list[asyncio.Future[None]]] = field(default_factory=dict)  # channel -> waiters
    pinged_at: float | None = None  # when the reader pinged and heard nothing since
    heard_at: float = 0.0  # when the reader last received anything from Redis (or opened)

    async def reopen(self, run_ids: set[int]) -> None:
        await self.close()
        self.client = redis.asyncio.Redis.from_url(
            self.bus.url,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_keepalive=True,
            retry=AsyncRetry(NoBackoff(), 0),
        )
        self.pubsub = self.client.pubsub()
        self.pinged_at = None
        try:
            # Bounded as a whole: a Redis that accepts connections but answers nothing (paused, a hung
            # proxy) would hold the handshake forever (the reader's connection has no socket timeout).
            async with asyncio.timeout(CONNECT_TIMEOUT_S + LISTEN_TIMEOUT_S):
                await self.pubsub.connect()
                if run_ids:
                    channels = [self.bus.channel(r) for r in run_ids]
                    await self.pubsub.subscribe(*channels)
                    await self._confirm(set(channels))
            self.heard_at = time.monotonic()
        except (redis.exceptions.RedisError, OSError, TimeoutError) as exc:
            await self.close()
            raise BusUnavailable(f"redis subscribe failed: {exc!r}") from exc

    async def _confirm(self, channels: set[str]) -> None:
        """Read until Redis confirmed every one of ``channels`` (nothing else reads yet)."""
        async with asyncio.timeout(LISTEN_TIMEOUT_S):
            while channels:
                message = await self.pubsub.get_message(timeout=LISTEN_TIMEOUT_S)
                if message is not None and message["type"] == "subscribe":
                    channels.discard(message["channel"].decode("utf8"))

    async def listen(self, run_id: int) -> None:
        if self.pubsub is None:
            raise BusUnavailable("the reader is closed")
        channel = self.bus.channel(run_id)
        confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self.confirming.setdefault(channel, [])
        waiting.append(confirmed)
        try:
            await self.pubsub.subscribe(channel)  # the reader task sees its confirmation
            async with asyncio.timeout(LISTEN_TIMEOUT_S):
                await confirmed
        except (redis.exceptions.RedisError, OSError, TimeoutError) as exc:
            raise BusUnavailable(f"redis subscribe failed: {exc!r}") from exc
        finally:
            if confirmed in waiting:
                waiting.remove(confirmed)

    async def unlisten(self, run_id: int) -> None:
        if self.pubsub is not None:
            # (a connection that failed forgot its subscriptions; the reader notices it)
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                await self.pubsub.unsubscribe(self.bus.channel(run_id))

    async def receive(self) -> list[Envelope]:
        if self.pubsub is None:
            raise BusUnavailable("the reader is closed")
        batch: list[Envelope] = []
        silent_s = silent_bound_s()
        task = asyncio.current_task()
        try:
            while len(batch) < RECEIVE_BATCH:
                # Wait until the next health check is due; once something arrived, only take what else
                # already did. (A timeout of 0 after a pong or a confirmation, with nothing to return,
                # used to ping again at once: a reader idle for HEALTH_S pinged Redis in a busy loop.)
                timeout = 0.0 if batch else self._until_check(silent_s)
                started = time.monotonic()
                message = await self.pubsub.get_message(timeout=timeout)
                if task is not None and task.cancelling():
                    # redis-py's timed read sometimes ends as if it had timed out although this task
                    # was cancelled meanwhile: the hub, stopping, would wait for it forever.
                    raise asyncio.CancelledError
                if message is None:
                    if batch:
                        return batch
                    await self._check_alive(silent_s, started)
                    continue
                self.heard_at, self.pinged_at = time.monotonic(), None
                self._take(message, batch)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise BusUnavailable(f"redis pub/sub failed: {exc!r}") from exc
        return batch

    def _until_check(self, silent_s: float) -> float:
        """Seconds until the next health check: the ping after ``silent_s`` of silence, or the ping's
        deadline."""
        since = self.heard_at if self.pinged_at is None else self.pinged_at
        return max(0.0, since + silent_s - time.monotonic())

    def _take(self, message: dict[str, Any], batch: list[Envelope]) -> None:
        kind = message["type"]
        if kind == "message":
            try:
                batch.append(Envelope.decode(message["data"]))
            except (ValueError, TypeError):
                log.warning("live bus: dropped a malformed message on %s", message.get("channel"))
        elif kind == "subscribe":
            for confirmed in self.confirming.pop(message["channel"].decode("utf8"), []):
                if not confirmed.done():
                    confirmed.set_result(None)

    async def _check_alive(self, silent_s: float, read_from: float) -> None:
        """A read that began at ``read_from`` found nothing. Nothing arrived for ``silent_s``: ping; give
        up on a connection whose ping is not answered within ``silent_s`` (its hub then reopens the
        reader, and its followers read the database), once a read begun after that deadline found
        nothing (a pong that waited in the socket while the event loop was busy is not a silence)."""
        now = time.monotonic()
        if self.pinged_at is None:
            if now - self.heard_at >= silent_s:
                self.pinged_at = now
                await self.pubsub.ping()
        elif read_from - self.pinged_at >= silent_s:
            raise BusUnavailable(f"redis did not answer a ping in {silent_s:g} s")

    async def close(self) -> None:
        pubsub, self.pubsub = self.pubsub, None
        client, self.client = self.client, None
        for waiting in self.confirming.values():
            for confirmed in waiting:
                if not confirmed.done():
                    confirmed.set_exception(BusUnavailable("the reader was closed"))
        self.confirming.clear()
        try:
            if pubsub is not None:
                await pubsub.aclose()
            if client is not None:
                await client.aclose()
        except (redis.exceptions.RedisError, OSError):
            pass  # a connection that failed is closed already


class RedisBus:
    """Redis pub/sub on ``<prefix>:live:<run id>``. Publishing retries once on a closed connection: a
    client's pool keeps its connections across a Redis restart, and the first command on each fails."""

    name = "redis"

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis] = (
            weakref.WeakKeyDictionary()
        )
        self._sync_client: redis.Redis | None = None
        self._lock = threading.Lock()

    def channel(self, run_id: int) -> str:
        return f"{self.prefix}:live:{run_id}"

    def reader(self) -> RedisReader:
        return RedisReader(self)

    def _client(self) -> redis.asyncio.Redis:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = redis.asyncio.Redis.from_url(
                self.url,
                socket_timeout=SOCKET_TIMEOUT_S,
                socket_connect_timeout=CONNECT_TIMEOUT_S,
                socket_keepalive=True,
                retry=AsyncRetry(NoBackoff(), 1),
            )
        return client

    async def publish(self, envelope: Envelope) -> None:
        try:
            await self._client().publish(self.channel(envelope.run_id), envelope.encode())
        except (redis.exceptions.RedisError, OSError) as exc:
            raise BusUnavailable(f"redis publish failed: {exc!r}") from exc

    async def listeners(self, run_id: int) -> int:
        channel = self.channel(run_id)
        counts = await self._client().pubsub_numsub(channel)
        return int(dict(counts).get(channel.encode(), 0))

    def publish_sync(self, envelope: Envelope) -> None:
        with self._lock:
            if self._sync_client is None:
                self._sync_client = redis.Redis.from_url(
                    self.url,
                    socket_timeout=SOCKET_TIMEOUT_S,
                    socket_connect_timeout=CONNECT_TIMEOUT_S,
                    socket_keepalive=True,
                    retry=Retry(NoBackoff(), 1),
                )
            client = self._sync_client
        try:
            client.publish(self.channel(envelope.run_id), envelope.encode())
        except (redis.exceptions.RedisError, OSError) as exc:
            raise BusUnavailable(f"redis publish failed: {exc!r}") from exc


# --- from settings --------------------------------------------------------------------------------------

_buses: dict[tuple[str, str], LiveBus] = {}
_buses_lock = threading.Lock()


def live_bus() -> LiveBus:
    """The bus ``settings.LIVE_BUS`` describes (``{"url": ..., "prefix": ...}``: Redis; ``None``: in
    process), one per process and description (tests swap settings)."""
    conf = getattr(settings, "LIVE_BUS", None) or {}
    key = (str(conf.get("url", "")), str(conf.get("prefix", "rlp")))
    with _buses_lock:
        bus = _buses.get(key)
        if bus is None:
            bus = _buses[key] = RedisBus(*key) if key[0] else MemoryBus()
        return bus

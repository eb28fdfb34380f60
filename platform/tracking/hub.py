"""The live fan-out of one web process: one bus subscription per followed run, not per socket.

A ``LiveHub`` (one per event loop and bus) owns one ``BusReader`` (tracking/bus.py). It listens to a run
when the first local follower of that run subscribes and stops when the last one goes; one reader task
receives each envelope once and puts it in every subscriber's ``Inbox``, which the follower's own task
reads (tracking/consumers.py). Under a sweep's load (20 runs logging every 40 ms, 100 followers on one
process) a receive per socket was what fell behind (docs/benchmarks.md).

The hub also owns the bus's failures: when a receive fails (Redis away, or silent: a ping unanswered for
``LIVE_BUS_SILENT_S``, tracking/bus.py) it marks itself down, reopens the reader with a backoff (subscribing
to every followed run again), and then tells every subscriber to read what it missed (a ``Resync`` in its
inbox). Consumers poll the database faster while the hub is down. The hub reads only while
it has followers; a loss it could not repair before its last follower left is logged as such, and the
next reader it opens logs that the bus is reachable again.

A publish in this process hands its envelope to this loop's hub at once (``deliver``) and marks it with the
hub's ``origin``, so that the hub's reader skips the same envelope when the bus brings it back.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import weakref
from dataclasses import dataclass

from tracking.bus import BusReader, BusUnavailable, Envelope, LiveBus

log = logging.getLogger(__name__)

INBOX_MAX = 1000  # envelopes a consumer may fall behind by; beyond, new ones wait for its database poll
RETRY_MIN_S = 0.5  # first wait before reopening the reader after the bus failed
RETRY_MAX_S = 5.0  # longest wait between two attempts


@dataclass(frozen=True, slots=True)
class Resync:
    """The hub reached the bus again after losing it: read from the database what it did not carry."""


RESYNC = Resync()
InboxItem = Envelope | Resync


class Inbox:
    """What the hub delivers to one consumer, in order."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[InboxItem] = asyncio.Queue(INBOX_MAX)
        self.overflowing = False  # an item was dropped and none delivered since (logged once)

    def put(self, item: InboxItem) -> None:
        try:
            self.queue.put_nowait(item)
            self.overflowing = False
        except asyncio.QueueFull:
            if not self.overflowing:
                log.warning(
                    "a live follower is %d messages behind: dropping (its poll reads them)", INBOX_MAX
                )
            self.overflowing = True

    async def get(self) -> InboxItem:
        return await self.queue.get()


class LiveHub:
    """One bus reader per process (event loop) and bus, shared by every local follower."""

    def __init__(self, bus: LiveBus) -> None:
        self.bus = bus
        self.origin = uuid.uuid4().hex  # marks what this hub delivered itself
        self.subscribers: dict[int, set[Inbox]] = {}  # run id -> local inboxes
        self.up = False  # the reader is open and its last operation succeeded
        self.lost_since: float | None = None  # (monotonic) the bus failed and no reader opened since
        self._reader: BusReader | None = None
        self._task: asyncio.Task[None] | None = None
        self._attempted = asyncio.Event()  # the reader task tried to open the reader at least once

    async def subscribe(self, run_id: int, inbox: Inbox) -> bool:
        """Deliver ``run_id``'s envelopes to ``inbox`` from now on; False when the bus is unreachable
        (the subscription stands: the hub listens to the run once the bus is back)."""
        first = run_id not in self.subscribers
        self.subscribers.setdefault(run_id, set()).add(inbox)
        if self._task is None or self._task.done():
            self._attempted.clear()
            self._task = asyncio.get_running_loop().create_task(self._read_forever(), name="live-hub")
        if not self.up:
            # A new reader opens with every followed run, this one included; one that failed keeps
            # retrying in its task (the consumer follows the database meanwhile).
            await self._attempted.wait()
            return self.up
        if not first:
            return True
        assert self._reader is not None
        try:
            await self._reader.listen(run_id)
        except BusUnavailable:
            log.warning("live bus: could not listen to run %s", run_id, exc_info=True)
            return False
        return True

    async def unsubscribe(self, run_id: int, inbox: Inbox) -> None:
        inboxes = self.subscribers.get(run_id)
        if inboxes is None or inbox not in inboxes:
            return
        inboxes.discard(inbox)
        if inboxes:
            return
        del self.subscribers[run_id]
        if not self.subscribers:  # nothing to read for: the next subscriber starts a reader again
            await self._stop()
        elif self.up and self._reader is not None:
            await self._reader.unlisten(run_id)

    async def _stop(self) -> None:
        # Taken before waiting: a subscriber that comes meanwhile starts a reader of its own.
        task, self._task = self._task, None
        reader, self._reader = self._reader, None
        self.up = False
        if self.lost_since is not None:
            log.info(
                "live bus still unreachable (for %.1f s) as the last live follower left: "
                "no reader until one comes",
                time.monotonic() - self.lost_since,
            )
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # (its cancellation is not this task's)
        if reader is not None:
            await reader.close()

    async def _open(self) -> bool:
        """A fresh reader listening to every followed run."""
        if self._reader is None:
            self._reader = self.bus.reader()
        try:
            await self._reader.reopen(set(self.subscribers))
        except BusUnavailable as exc:
            log.info("live bus unreachable (%s)", exc)
            return False
        return True

    async def _read_forever(self) -> None:
        delay = RETRY_MIN_S
        lost = False  # the bus failed while followed: what it dropped is in the database
        while self.subscribers:
            if not self.up:
                opened = await self._open()
                self.up = opened
                self._attempted.set()
                if not opened:
                    lost = True
                    self._lost()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
                    continue
                delay = RETRY_MIN_S
                if self.lost_since is not None:  # (lost by this reader task or by an earlier one)
                    log.info(
                        "live bus reachable again after %.1f s: %d runs followed",
                        time.monotonic() - self.lost_since,
                        len(self.subscribers),
                    )
                    self.lost_since = None
                if lost:
                    self._resync()
                    lost = False
            assert self._reader is not None
            try:
                envelopes = await self._reader.receive()
            except BusUnavailable as exc:
                log.warning("live bus lost (%s): live followers read the database meanwhile", exc)
                self.up, lost = False, True
                self._lost()
                continue
            except Exception:  # a bug must not end every follower's live stream: reopen, as above
                log.exception("live bus reader failed")
                self.up, lost = False, True
                self._lost()
                await asyncio.sleep(delay)
                continue
            for envelope in envelopes:
                if envelope.origin != self.origin:
                    self.deliver(envelope)

    def _lost(self) -> None:
        if self.lost_since is None:
            self.lost_since = time.monotonic()

    def _resync(self) -> None:
        """Tell every subscriber to read from the database what the bus may not have carried."""
        for inboxes in list(self.subscribers.values()):
            for inbox in list(inboxes):
                inbox.put(RESYNC)

    def deliver(self, envelope: Envelope) -> None:
        """Hand an envelope to this process's followers of its run."""
        for inbox in list(self.subscribers.get(envelope.run_id, ())):
            inbox.put(envelope)


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, LiveHub]] = weakref.WeakKeyDictionary()


def local_hub(bus: LiveBus) -> LiveHub | None:
    """The running event loop's hub for ``bus`` when one exists, else None (no follower ever subscribed
    on this loop)."""
    hub = _hubs.get(asyncio.get_running_loop(), {}).get(id(bus))
    return hub if hub is not None and hub.bus is bus else None


def hub_for(bus: LiveBus) -> LiveHub:
    """The hub of the running event loop for ``bus`` (settings may swap the bus: tests do)."""
    hubs = _hubs.setdefault(asyncio.get_running_loop(), {})
    hub = hubs.get(id(bus))
    if hub is None or hub.bus is not bus:
        hub = hubs[id(bus)] = LiveHub(bus)
    return hub

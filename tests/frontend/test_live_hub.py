"""The live fan-out of one web process (tracking/hub.py) over the live bus (tracking/bus.py): followers of
a run share one bus subscription and each still gets every message; a burst waiting for the reader is
read in batches, in order; a live message reaches its socket while the thread the consumers share for
database reads is busy; the publishing process serves its own followers from its outbox, once, whatever
the bus does. Real ASGI stack, database and bus (Redis in the production pass, in process otherwise; the
tests of what only the Redis bus does run on Redis in both: a private server on the embedded default)."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from tests.frontend.test_consumers import (  # noqa: F401  (fixtures: setup, no_poll; autouse: close_thread_connections)
    announce,
    close_thread_connections,
    communicator,
    no_poll,
    setup,
)
from tracking import hub as hub_module
from tracking import live
from tracking.bus import BusUnavailable, Envelope, RedisBus, live_bus
from tracking.hub import RESYNC, Inbox, LiveHub, hub_for
from tracking.services import Point, metrics_ingest

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def metrics(step: int) -> dict[str, Any]:
    return {
        "kind": "metrics",
        "count": 1,
        "series": {"k": {"steps": [step], "values": [0.0], "wall_times": [0.0]}},
    }


def another_process(url: str) -> RedisBus:
    """The bus as another web process holds it: its own clients and connections, the same channels."""
    bus = live_bus()
    assert isinstance(bus, RedisBus)
    return RedisBus(url, bus.prefix)


async def test_followers_of_a_run_share_one_subscription_and_each_receives_every_point(setup, no_poll):  # noqa: F811
    run = setup["run"]
    bus = live_bus()
    before = await bus.listeners(run.pk)  # (a subscription another test process holds for this run id)
    comms = [communicator(run.pk, setup["cookie"][name], last_seq=3) for name in ("owner", "viewer", "owner")]
    for comm in comms:
        assert (await comm.connect())[0]
        assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    assert await bus.listeners(run.pk) == before + 1  # one per process, not one per socket
    ingest = database_sync_to_async(metrics_ingest)
    for step in range(3):
        await ingest(run_id=run.pk, points=[Point("reward/mean", step, 0.1 * step, 1.0 + step)])
    for comm in comms:
        steps: list[int] = []
        while len(steps) < 3:
            msg = await comm.receive_json_from(timeout=3)
            assert msg["kind"] == "metrics" and "source" not in msg  # live, not read back by a poll
            steps += msg["series"]["reward/mean"]["steps"]
        assert steps == [0, 1, 2]
    await comms[0].disconnect()
    assert await bus.listeners(run.pk) == before + 1  # two followers left
    for comm in comms[1:]:
        await comm.disconnect()
    assert await bus.listeners(run.pk) == before


async def test_a_burst_waiting_for_the_reader_is_read_in_batches_in_order(redis_bus):
    """While the hub's event loop is blocked, another process publishes 300 messages; once the loop runs
    again they come out of the reader in batches and in publish order."""
    sizes: list[int] = []

    class CountingBus(RedisBus):
        def reader(self) -> Any:
            reader = super().reader()
            receive = reader.receive

            async def counted() -> list[Envelope]:
                batch = await receive()
                sizes.append(len(batch))
                return batch

            reader.receive = counted  # type: ignore[method-assign]
            return reader

    bus = live_bus()
    hub, inbox = LiveHub(CountingBus(redis_bus, bus.prefix)), Inbox()
    assert await hub.subscribe(987654, inbox)
    publisher = another_process(redis_bus)

    def publish_all() -> None:  # another thread (the hub's loop is blocked meanwhile): everything waits
        for step in range(300):
            publisher.publish_sync(live.LiveMessage(987654, metrics(step), []).envelope())

    thread = threading.Thread(target=publish_all)
    thread.start()
    thread.join(timeout=60)
    got: list[int] = []
    while len(got) < 300:
        envelope = await asyncio.wait_for(inbox.get(), timeout=10)
        assert isinstance(envelope, Envelope)
        got += json.loads(envelope.text)["series"]["k"]["steps"]
    assert got == list(range(300))
    assert max(sizes) > 1, sizes
    await hub.unsubscribe(987654, inbox)


async def test_a_live_message_arrives_while_the_shared_database_thread_is_busy(setup, no_poll):  # noqa: F811
    """Channels runs close_old_connections before each message it dispatches, on the one thread all
    consumers share for database reads; live messages do not wait for it (under load they waited tens of
    seconds): the consumer reads its inbox itself."""
    run = setup["run"]
    comm = communicator(run.pk, setup["cookie"]["owner"], last_seq=3)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait)(30))  # thread-sensitive: the shared thread
    try:
        await asyncio.sleep(0.1)
        assert not busy.done()
        await announce(run.pk, metrics(5))
        # (a receive that times out would cancel the consumer: wait with receive_nothing instead)
        assert not await comm.receive_nothing(timeout=5), "no live message while the thread was busy"
        msg = await comm.receive_json_from(timeout=1)
        assert msg["series"]["k"]["steps"] == [5], msg
        assert not busy.done()  # delivered while the thread was still held
    finally:
        release.set()
        await busy
    await comm.disconnect()


async def test_the_publishing_process_hands_its_own_followers_the_message_and_the_bus_the_rest(redis_bus):
    """A web process's followers of a run get what that process publishes straight from its outbox, once
    (its reader skips the copy the bus brings back); the bus carries it to the other processes' hubs."""
    run_id = 565656
    live.bind_server_loop(asyncio.get_running_loop())  # as the ASGI application does on a connection
    here, here_inbox = hub_for(live_bus()), Inbox()
    other, other_inbox = LiveHub(another_process(redis_bus)), Inbox()
    try:
        assert await here.subscribe(run_id, here_inbox)
        assert await other.subscribe(run_id, other_inbox)
        await sync_to_async(live.publish)(run_id, metrics(1))  # a request thread of this process
        got_here = await asyncio.wait_for(here_inbox.get(), 5)
        got_there = await asyncio.wait_for(other_inbox.get(), 5)
        assert isinstance(got_here, Envelope) and isinstance(got_there, Envelope)
        assert got_here.text == got_there.text and json.loads(got_here.text)["series"]["k"]["steps"] == [1]
        assert got_here.origin == here.origin  # served from the outbox
        await announce(run_id, metrics(2))  # published elsewhere: both get it from the bus, after the first
        assert json.loads((await asyncio.wait_for(here_inbox.get(), 5)).text)["series"]["k"]["steps"] == [2]
        assert here_inbox.queue.empty()  # the copy of the first that the bus brought back was skipped
    finally:
        await here.unsubscribe(run_id, here_inbox)
        await other.unsubscribe(run_id, other_inbox)


async def test_when_the_bus_fails_the_publishing_process_still_hands_its_followers_every_message(
    redis_bus, monkeypatch
):
    """A send that fails (Redis away) drops what waited behind it for the other processes (their polls
    read it); this process's own followers still get every message, in order."""
    bus = live_bus()
    run_id = 575757
    live.bind_server_loop(asyncio.get_running_loop())  # as the ASGI application does on a connection
    hub, inbox = hub_for(bus), Inbox()
    gate = asyncio.Event()

    async def failing(envelope: Envelope) -> None:
        await gate.wait()
        raise ConnectionError("Redis went away")

    try:
        assert await hub.subscribe(run_id, inbox)
        monkeypatch.setattr(bus, "publish", failing)

        def view() -> None:  # a request thread: three events, the first one's send hangs, then fails
            for seq in (1, 2, 3):
                live.publish(run_id, {"kind": "event", "event": {"seq": seq}})

        await sync_to_async(view)()
        await asyncio.sleep(0.2)  # the second and third wait behind the first send
        gate.set()
        got = [(await asyncio.wait_for(inbox.get(), 5)).seq for _ in range(3)]  # type: ignore[union-attr]
        assert got == [1, 2, 3]
    finally:
        await hub.unsubscribe(run_id, inbox)


def _items(payload: dict[str, Any]) -> list[tuple[str, int]]:
    """What a live payload carries, flattened: ("e", seq) for an event, ("m", step) per metrics point."""
    if payload["kind"] == "event":
        return [("e", payload["event"]["seq"])]
    return [("m", step) for step in payload["series"]["k"]["steps"]]


def _sent_as(published: list[dict[str, Any]]) -> list[list[tuple[str, int]]]:
    """The messages an outbox sends when every one was published before its first send (tracking/live.py:
    consecutive metrics messages merge while they wait, events never do), as their items."""
    units: list[list[tuple[str, int]]] = []
    for payload, previous in zip(published, [None, *published[:-1]], strict=True):
        if previous is not None and payload["kind"] == previous["kind"] == "metrics":
            units[-1] += _items(payload)
        else:
            units.append(_items(payload))
    return units


async def _take(inbox: Inbox, n: int) -> list[tuple[str, int]]:
    got: list[tuple[str, int]] = []
    while len(got) < n:
        envelope = await asyncio.wait_for(inbox.get(), 10)
        assert isinstance(envelope, Envelope)
        got += _items(json.loads(envelope.text))
    return got


async def test_each_follower_gets_every_message_once_in_order_whatever_sends_fail(redis_bus, monkeypatch):
    """Random sequences of events and metrics published by one web process, some of whose sends fail
    (the bus away), against the reference rule: each of this process's followers gets every message,
    once, in publish order, straight from the outbox (the copy the bus brings back is skipped: no second
    one); another process's follower gets, once and in order, what was sent before the first failed send
    (what waited behind it is left to its poll), then what is published next. Redis in both deployments
    (a private server on the embedded default)."""
    bus, loop = live_bus(), asyncio.get_running_loop()
    run_id = 585858
    here, mine = hub_for(bus), [Inbox(), Inbox()]
    other, theirs = LiveHub(another_process(redis_bus)), Inbox()
    failing: set[tuple[str, int]] = set()  # a send carrying one of these items fails
    real_publish = bus.publish

    async def flaky(envelope: Envelope) -> None:
        if failing & set(_items(json.loads(envelope.text))):
            raise ConnectionError("the bus is away")
        await real_publish(envelope)

    def publish_held(payloads: list[dict[str, Any]]) -> None:
        """Publish from a request thread of this server while its loop is held: every message waits in
        the outbox before the first send."""

        def view() -> None:
            live.bind_loop(loop)
            for payload in payloads:
                live.publish(run_id, payload)

        thread = threading.Thread(target=view)
        thread.start()
        thread.join(30)

    monkeypatch.setattr(bus, "publish", flaky)
    rng, seq = random.Random(20261203), 0
    try:
        for inbox in mine:
            assert await here.subscribe(run_id, inbox)
        assert await other.subscribe(run_id, theirs)
        for _ in range(25):
            published = []
            for _ in range(rng.randint(1, 8)):
                seq += 1
                published.append(
                    {"kind": "event", "event": {"seq": seq}} if rng.random() < 0.5 else metrics(seq)
                )
            units = _sent_as(published)
            failing.clear()
            for unit in rng.sample(units, k=min(len(units), rng.choice([0, 0, 1, 2]))):
                failing.add(rng.choice(unit))
            publish_held(published)
            everything = [item for unit in units for item in unit]
            for inbox in mine:
                assert await _take(inbox, len(everything)) == everything, (published, failing)
            first_failed = next((k for k, unit in enumerate(units) if failing & set(unit)), len(units))
            sent = [item for unit in units[:first_failed] for item in unit]
            seq += 1
            publish_held([{"kind": "event", "event": {"seq": seq}}])  # the next message: sent
            assert await _take(theirs, len(sent) + 1) == [*sent, ("e", seq)], (published, failing)
            for inbox in mine:  # (theirs got the last one through the bus: so did this process's reader)
                assert await _take(inbox, 1) == [("e", seq)] and inbox.queue.empty()
    finally:
        for inbox in mine:
            await here.unsubscribe(run_id, inbox)
        await other.unsubscribe(run_id, theirs)


class ScriptedBus:
    """A bus whose reader's receives are scripted: each one takes the next item of ``script`` (a list of
    envelopes, or an exception to raise). Counts the reader's (re)opens."""

    name = "scripted"

    def __init__(self) -> None:
        self.script: asyncio.Queue[list[Envelope] | BaseException] = asyncio.Queue()
        self.opens = 0

    def reader(self) -> Any:
        bus = self

        class Reader:
            async def reopen(self, run_ids: set[int]) -> None:
                bus.opens += 1

            async def listen(self, run_id: int) -> None: ...

            async def unlisten(self, run_id: int) -> None: ...

            async def receive(self) -> list[Envelope]:
                item = await bus.script.get()
                if isinstance(item, BaseException):
                    raise item
                return item

            async def close(self) -> None: ...

        return Reader()

    async def publish(self, envelope: Envelope) -> None: ...

    def publish_sync(self, envelope: Envelope) -> None: ...

    async def listeners(self, run_id: int) -> int:
        return 0


@pytest.mark.parametrize("failure", [BusUnavailable("redis went away"), RuntimeError("a bug in the reader")])
async def test_a_failed_receive_then_an_immediate_reopen_tells_every_follower_to_resync(failure, monkeypatch):
    """A receive fails and the reader reopens at once (no failed attempt in between): what the bus
    dropped meanwhile is only in the database, so every follower of every run must still be told to read
    it (a Resync in its inbox), after the envelopes delivered before and before those after."""
    monkeypatch.setattr(hub_module, "RETRY_MIN_S", 0.01)  # (the wait after an unexpected error)
    bus = ScriptedBus()
    hub = LiveHub(bus)  # type: ignore[arg-type]
    a1, a2, b = Inbox(), Inbox(), Inbox()
    try:
        assert await hub.subscribe(1, a1) and await hub.subscribe(1, a2) and await hub.subscribe(2, b)
        assert bus.opens == 1 and hub.up
        before = Envelope(run_id=1, kind="event", text="{}", seq=1)
        after = Envelope(run_id=1, kind="event", text="{}", seq=3)
        await bus.script.put([before])
        await bus.script.put(failure)
        await bus.script.put([after])
        for inbox in (a1, a2):
            got = [await asyncio.wait_for(inbox.get(), 5) for _ in range(3)]
            assert got == [before, RESYNC, after]
        assert await asyncio.wait_for(b.get(), 5) == RESYNC
        assert bus.opens == 2 and hub.up
        assert all(inbox.queue.empty() for inbox in (a1, a2, b))  # one resync each, nothing else
    finally:
        for run_id, inbox in ((1, a1), (1, a2), (2, b)):
            await hub.unsubscribe(run_id, inbox)


async def test_a_follower_reads_what_was_stored_while_its_hub_lost_the_bus(setup, no_poll, monkeypatch):  # noqa: F811
    """End to end on the process's own bus: the hub's receive fails once and the reader reopens at once;
    an event stored meanwhile and never announced reaches the socket through the resync (the fallback
    poll, slowed here to a minute, cannot be what brings it)."""
    from experiments.models import Run
    from tracking import consumers
    from tracking.models import RunEvent

    monkeypatch.setattr(consumers, "FALLBACK_POLL_S", 60.0)
    run = setup["run"]
    comm = communicator(run.pk, setup["cookie"]["owner"], last_seq=3)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    hub = hub_for(live_bus())
    reader = hub._reader
    assert reader is not None and hub.up
    fail_next = [True]
    receive = reader.receive

    async def failing_once() -> list[Envelope]:
        if fail_next:
            fail_next.clear()
            raise BusUnavailable("the bus went away")
        return await receive()

    def store_quietly() -> None:  # another process's event whose announcement the bus dropped
        RunEvent.objects.create(run=run, seq=4, kind="log", message="dropped by the bus")
        Run.objects.filter(pk=run.pk).update(event_seq=4)

    await database_sync_to_async(store_quietly)()
    reader.receive = failing_once  # type: ignore[method-assign]
    await announce(run.pk, metrics(1))  # wakes the pending receive; the next one fails
    first = await comm.receive_json_from(timeout=3)
    assert first["kind"] == "metrics"
    event = await comm.receive_json_from(timeout=5)
    assert event["kind"] == "event" and (event["event"]["seq"], event["event"]["message"]) == (
        4,
        "dropped by the bus",
    )
    assert not fail_next and hub.up
    await comm.disconnect()


@pytest.mark.parametrize("n", [499, 500, 501, 1000, 1001])
async def test_a_backlog_around_the_receive_batch_size_is_received_whole_and_in_order(redis_bus, n):
    """Redis holds ``n`` messages for a reader when it reads: every one comes out, in order, in batches
    of at most RECEIVE_BATCH, one of them full: the message that fills a batch must not be lost."""
    from tracking.bus import RECEIVE_BATCH

    assert RECEIVE_BATCH == 500
    bus = another_process(redis_bus)
    reader = RedisBus(redis_bus, bus.prefix).reader()
    run_id = 595959
    try:
        await reader.reopen({run_id})
        for seq in range(1, n + 1):  # synchronous: the reader reads nothing meanwhile
            bus.publish_sync(Envelope(run_id=run_id, kind="event", text=f'{{"n": {seq}}}', seq=seq))
        await asyncio.sleep(0.5)  # (the loop takes what arrived off the socket: a receive finds it all)
        got: list[int] = []
        sizes: list[int] = []
        while len(got) < n:
            batch = await asyncio.wait_for(reader.receive(), 10)
            sizes.append(len(batch))
            got += [e.seq for e in batch]
        assert got == list(range(1, n + 1))
        assert max(sizes) <= RECEIVE_BATCH, sizes
        assert n < RECEIVE_BATCH or RECEIVE_BATCH in sizes, sizes  # (a batch was filled: the case at stake)
    finally:
        await reader.close()

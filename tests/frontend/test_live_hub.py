"""The live fan-out of one web process (tracking/hub.py): followers of a run share one channel-layer
membership, each still gets every message; a burst waiting in Redis is read in batches, in order; and a
live message reaches its socket while the thread the consumers share for database reads is busy.
Real ASGI stack, database and channel layer (Redis in the production pass, in-memory otherwise; the
tests of what only a Redis layer does run on Redis in both: a private server on the embedded default)."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from tests.frontend.test_consumers import (  # noqa: F401  (fixtures: setup, no_poll; autouse: close_thread_connections)
    close_thread_connections,
    communicator,
    no_poll,
    setup,
)
from tracking import live
from tracking.hub import Inbox, LiveHub
from tracking.services import Point, metrics_ingest

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def memberships(group: str) -> int:
    """How many channels the layer holds in ``group``, read from the layer's own store."""
    from channels_redis.core import RedisChannelLayer

    layer = get_channel_layer()
    if isinstance(layer, RedisChannelLayer):
        return await layer.connection(layer.consistent_hash(group)).zcard(layer._group_key(group))
    return len(layer.groups.get(group, {}))


def metrics(step: int) -> dict[str, Any]:
    return {
        "kind": "metrics",
        "count": 1,
        "series": {"k": {"steps": [step], "values": [0.0], "wall_times": [0.0]}},
    }


async def test_followers_of_a_run_share_one_membership_and_each_receives_every_point(setup, no_poll):  # noqa: F811
    run = setup["run"]
    group = live.group_name(run.pk)
    before = await memberships(group)  # (a stale membership another test process left for this run id)
    comms = [communicator(run.pk, setup["cookie"][name], last_seq=3) for name in ("owner", "viewer", "owner")]
    for comm in comms:
        assert (await comm.connect())[0]
        assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    assert await memberships(group) == before + 1  # one per process, not one per socket (was 3)
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
    assert await memberships(group) == before + 1  # two followers left
    for comm in comms[1:]:
        await comm.disconnect()
    assert await memberships(group) == before


async def test_a_burst_waiting_in_the_layer_is_read_in_batches_in_order(redis_layer):
    """While the hub's event loop is blocked, 300 messages pile up in Redis; once it runs again they come
    out in batches (channels-redis' own receive takes one per four commands) and in publish order."""
    layer = get_channel_layer()
    hub, inbox = LiveHub(layer), Inbox()
    sizes: list[int] = []
    read = hub._receive_batch

    async def counted() -> list[dict[str, Any]]:
        batch = await read()
        sizes.append(len(batch))
        return batch

    hub._receive_batch = counted  # type: ignore[method-assign]
    group = "run_987654"
    assert await hub.subscribe(group, inbox)

    def publish_all() -> (
        None
    ):  # another thread, its own loop and layer connections: another process's publisher
        async def go() -> None:
            from channels_redis.core import RedisChannelLayer

            from config.layers import redis_channel_layer

            publisher = RedisChannelLayer(**redis_channel_layer(redis_layer, layer.prefix)["CONFIG"])
            for step in range(300):
                await live.send(publisher, group, live.layer_message(987654, metrics(step)))

        async_to_sync(go)()

    publisher = threading.Thread(target=publish_all)
    publisher.start()
    publisher.join(timeout=60)  # the hub's loop is blocked meanwhile: everything waits in Redis
    got: list[int] = []
    while len(got) < 300:
        message = await asyncio.wait_for(inbox.get(), timeout=10)
        got += message["payload"]["series"]["k"]["steps"]
        assert message["text"]  # encoded once by the hub
    assert got == list(range(300))
    assert max(sizes) > 1, sizes
    await hub.unsubscribe(group, inbox)
    await layer.close_pools()


async def test_a_live_message_arrives_while_the_shared_database_thread_is_busy(setup, no_poll):  # noqa: F811
    """Channels runs close_old_connections before each message on the one thread all consumers share for
    database reads; live messages do not wait for it (under load they waited tens of seconds)."""
    run = setup["run"]
    comm = communicator(run.pk, setup["cookie"]["owner"], last_seq=3)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait)(30))  # thread-sensitive: the shared thread
    try:
        await asyncio.sleep(0.1)
        assert not busy.done()
        await live.send(get_channel_layer(), live.group_name(run.pk), live.layer_message(run.pk, metrics(5)))
        # (a receive that times out would cancel the consumer: wait with receive_nothing instead)
        assert not await comm.receive_nothing(timeout=5), "no live message while the thread was busy"
        msg = await comm.receive_json_from(timeout=1)
        assert msg["series"]["k"]["steps"] == [5], msg
        assert not busy.done()  # delivered while the thread was still held
    finally:
        release.set()
        await busy
    await comm.disconnect()


async def test_a_group_send_in_two_round_trips_is_what_channels_redis_receivers_read(redis_layer):
    """``live.send`` writes the group's queues itself on channels-redis (two round trips, not four): two
    processes' channels in a group each get the message through channels-redis' own ``receive``; a queue
    at the sender's capacity drops it, as channels-redis does; a member past the group expiry is dropped
    from the group and gets nothing."""
    from channels_redis.core import RedisChannelLayer

    from config.layers import redis_channel_layer

    prefix = get_channel_layer().prefix + "-send"
    config = redis_channel_layer(redis_layer, prefix)["CONFIG"]
    publisher = RedisChannelLayer(**{**config, "capacity": 2})
    a, b = RedisChannelLayer(**config), RedisChannelLayer(**config)
    group = "run_424242"
    try:
        first, second = await a.new_channel(), await b.new_channel()
        await a.group_add(group, first)
        await b.group_add(group, second)
        for n in range(3):
            await live.send(publisher, group, {"type": "run.update", "n": n})
        for layer, channel in ((a, first), (b, second)):
            assert [(await layer.receive(channel))["n"] for _ in range(2)] == [0, 1]  # the third dropped
        # A membership older than the group expiry is removed by the next send, which it does not get.
        key = publisher._group_key(group)
        redis = publisher.connection(publisher.consistent_hash(group))
        await redis.zadd(key, {second: 1})  # joined in 1970
        await live.send(publisher, group, {"type": "run.update", "n": 3})
        assert (await a.receive(first))["n"] == 3
        assert [m.decode() for m in await redis.zrange(key, 0, -1)] == [first]
        assert await redis.zcard(prefix.encode() + b.non_local_name(second).encode()) == 0
    finally:
        for layer in (publisher, a, b):
            await layer.flush()
            await layer.close_pools()


async def test_the_publishing_process_hands_its_own_followers_the_message_and_redis_the_rest(redis_layer):
    """A web process's followers of a run get what that process publishes straight from its outbox; the
    layer carries it to the other processes' hubs only: this process's queue in Redis never holds it
    (so no second copy), and its hub's Redis reader is not needed (stopped here). On Redis in both
    deployments (a private server on the embedded default)."""
    from channels_redis.core import RedisChannelLayer

    from config.layers import redis_channel_layer
    from tracking.hub import hub_for

    layer = get_channel_layer()
    assert isinstance(layer, RedisChannelLayer)
    group = "run_565656"
    here, here_inbox = hub_for(layer), Inbox()
    other_layer = RedisChannelLayer(**redis_channel_layer(redis_layer, layer.prefix)["CONFIG"])
    other, other_inbox = LiveHub(other_layer), Inbox()  # another process: its own layer and hub
    try:
        assert await here.subscribe(group, here_inbox)
        assert await other.subscribe(group, other_inbox)
        here._reader.cancel()  # this process reads nothing from Redis from now on
        await sync_to_async(live.publish)(565656, metrics(1))  # a request thread of this process
        got_here = await asyncio.wait_for(here_inbox.get(), 5)
        got_there = await asyncio.wait_for(other_inbox.get(), 5)
        assert (
            got_here["payload"]["series"]["k"]["steps"] == got_there["payload"]["series"]["k"]["steps"] == [1]
        )
        assert got_here["text"]  # encoded once by the hub, as for a message read from Redis
        queue = layer.prefix + layer.non_local_name(here.channel)
        assert await layer.connection(layer.consistent_hash(queue)).zcard(queue) == 0
    finally:
        await here.unsubscribe(group, here_inbox)
        await other.unsubscribe(group, other_inbox)
        await other_layer.close_pools()
        await layer.close_pools()


async def test_when_the_layer_fails_the_publishing_process_still_hands_its_followers_every_message(
    redis_layer, monkeypatch
):
    """A send that fails (Redis away) drops what waited behind it for the other processes (their polls
    read it); this process's own followers still get every message, in order."""
    from tracking.hub import hub_for

    layer = get_channel_layer()
    group = "run_575757"
    hub, inbox = hub_for(layer), Inbox()
    gate = asyncio.Event()

    async def failing(*args: Any, **kwargs: Any) -> None:
        await gate.wait()
        raise ConnectionError("Redis went away")

    monkeypatch.setattr(live, "_group_send", failing)
    try:
        assert await hub.subscribe(group, inbox)

        def view() -> None:  # a request thread: three events, the first one's send hangs, then fails
            for seq in (1, 2, 3):
                live.publish(575757, {"kind": "event", "event": {"seq": seq}})

        await sync_to_async(view)()
        await asyncio.sleep(0.2)  # the second and third wait behind the first send
        gate.set()
        got = [(await asyncio.wait_for(inbox.get(), 5))["payload"]["event"]["seq"] for _ in range(3)]
        assert got == [1, 2, 3]
    finally:
        await hub.unsubscribe(group, inbox)
        await layer.close_pools()


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
        got += _items((await asyncio.wait_for(inbox.get(), 10))["payload"])
    return got


async def test_each_follower_gets_every_message_once_in_order_whatever_sends_fail(redis_layer, monkeypatch):
    """Random sequences of events and metrics published by one web process, some of whose sends fail
    (the layer away), against the reference rule: each of this process's followers gets every message,
    once, in publish order, straight from the outbox (its queue in Redis never holds one: no second
    copy); another process's follower gets, once and in order, what was sent before the first failed
    send (what waited behind it is left to its poll), then what is published next. Redis in both
    deployments (a private server on the embedded default)."""
    from channels_redis.core import RedisChannelLayer

    from config.layers import redis_channel_layer
    from tracking.hub import hub_for

    layer, loop = get_channel_layer(), asyncio.get_running_loop()
    assert isinstance(layer, RedisChannelLayer)
    run_id = 585858
    group = live.group_name(run_id)
    here, mine = hub_for(layer), [Inbox(), Inbox()]
    other_layer = RedisChannelLayer(**redis_channel_layer(redis_layer, layer.prefix)["CONFIG"])
    other, theirs = LiveHub(other_layer), Inbox()  # another process: its own layer and hub
    failing: set[tuple[str, int]] = set()  # a send carrying one of these items fails
    real_send = live._group_send

    async def flaky(layer_: Any, group_: str, message: dict[str, Any], skip: str | None = None) -> None:
        if failing & set(_items(message["payload"])):
            raise ConnectionError("the layer is away")
        await real_send(layer_, group_, message, skip)

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

    monkeypatch.setattr(live, "_group_send", flaky)
    rng, seq = random.Random(20261203), 0
    try:
        for inbox in mine:
            assert await here.subscribe(group, inbox)
        assert await other.subscribe(group, theirs)
        here._reader.cancel()  # this process reads nothing from Redis: its followers are served directly
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
            for inbox in mine:
                assert await _take(inbox, 1) == [("e", seq)] and inbox.queue.empty()
            assert await _take(theirs, len(sent) + 1) == [*sent, ("e", seq)], (published, failing)
        queue = layer.prefix + layer.non_local_name(here.channel)
        assert await layer.connection(layer.consistent_hash(queue)).zcard(queue) == 0
    finally:
        for inbox in mine:
            await here.unsubscribe(group, inbox)
        await other.unsubscribe(group, theirs)
        await other_layer.close_pools()
        await layer.close_pools()

"""A live bus that is connected but silent (Redis paused, a hung proxy), and the hub's log of losing and
reaching the bus (tracking/hub.py, tracking/bus.py). Each test runs its own
redis-server (harness/private_redis.py): the machine's shared Redis is never paused or stopped.

- What is stored while Redis is paused reaches an open websocket through the database before the pause
  ends: the hub's reader pings after ``LIVE_BUS_SILENT_S`` of silence and gives the bus up when the
  ping is not answered within as long again, and its followers poll the database meanwhile. The hub used
  to notice only at its 5 s ping deadline (followers got the points 4.5 s late on median, 10 s at worst).
- An idle reader pings once per ``LIVE_BUS_SILENT_S``: it used to ping in a busy loop once something
  other than a message (a pong, a subscription's confirmation) had arrived.
- "live bus lost" is always followed by "reachable again" once a reader opens, even when every follower
  left in between (the hub stops reading then; the next one's reader used to open without a word).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio
from channels.db import database_sync_to_async

from harness.private_redis import PrivateRedis, require_redis_server
from tests.frontend.test_consumers import (  # noqa: F401  (fixtures: setup; autouse: close_thread_connections)
    close_thread_connections,
    communicator,
    setup,
)
from tracking import live
from tracking.bus import RedisBus, live_bus
from tracking.hub import Inbox, LiveHub, hub_for
from tracking.services import Point, events_append, metrics_ingest

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

PAUSE_S = 6.0


@pytest_asyncio.fixture
async def private_redis(tmp_path) -> AsyncIterator[PrivateRedis]:
    require_redis_server()
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _outboxes_drained() -> None:
    """Until this loop's outboxes sent (or dropped) everything (a send blocked by the pause ends)."""
    loop = asyncio.get_running_loop()
    while live._outboxes.get(loop):
        await asyncio.sleep(0.1)


@pytest.mark.timeout(90)
async def test_what_is_stored_while_redis_is_paused_reaches_a_follower_before_the_pause_ends(
    setup,  # noqa: F811
    settings,
    private_redis,
    monkeypatch,
    caplog,
):
    """Redis paused for 6 s (``CLIENT PAUSE 6000 ALL``) under an open socket while another web process
    stores events and points through the services (its publishes wait on the paused Redis): the
    follower's hub gives the silent bus up (a ping unanswered for LIVE_BUS_SILENT_S) and the follower
    reads every stored item from the database, once and in order, while Redis is still paused and the
    hub still down. Then Redis answers again, the hub listens again and the stream is live."""
    caplog.set_level(logging.INFO, logger="tracking.hub")
    settings.LIVE_BUS = {"url": private_redis.url, "prefix": "rlp"}
    settings.LIVE_POLL_INTERVAL_S = 0  # no regular poll: only the fallback (the hub down) reads the database
    settings.LIVE_BUS_SILENT_S = 0.5
    publisher = RedisBus(private_redis.url, "rlp")  # another process's bus: no local hub delivers for it
    monkeypatch.setattr(live, "live_bus", lambda: publisher)
    run = setup["run"]
    ingest = database_sync_to_async(metrics_ingest)
    append = database_sync_to_async(events_append)
    admin = redis.asyncio.Redis.from_url(private_redis.url)
    comm = communicator(run.pk, setup["cookie"]["owner"], last_seq=3)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    hub = hub_for(live_bus())
    assert hub.up

    async def take() -> dict[str, Any]:
        return await comm.receive_json_from(timeout=20)  # (bounded by the test's timeout in practice)

    try:
        await ingest(run_id=run.pk, points=[Point("k", 0, 0.0, 1.0)])  # the bus works: live
        first = await take()
        assert first["kind"] == "metrics" and first["series"]["k"]["steps"] == [0] and "source" not in first

        paused_at = time.monotonic()
        await admin.execute_command("CLIENT", "PAUSE", str(int(PAUSE_S * 1000)), "ALL")
        for step in (1, 2, 3):  # events and points, interleaved
            await ingest(run_id=run.pk, points=[Point("k", step, 0.1 * step, 1.0 + step)])
            await append(run_id=run.pk, kind="log", message=f"paused {step}")
        steps: list[int] = []
        seqs: list[int] = []
        while steps != [1, 2, 3] or seqs != [4, 5, 6]:
            msg = await take()
            if msg["kind"] == "metrics":
                assert msg.get("source") == "poll", msg  # read from the database, not the bus
                steps += msg["series"]["k"]["steps"]
            elif msg["kind"] == "event":
                seqs.append(msg["event"]["seq"])
            assert steps == [1, 2, 3][: len(steps)] and seqs == [4, 5, 6][: len(seqs)], (steps, seqs)
        # The mechanism: the hub gave the silent bus up at its LIVE_BUS_SILENT_S bound (not the 5 s one)
        # and is still down: Redis is still paused (the pause was issued after `paused_at`).
        assert time.monotonic() - paused_at < PAUSE_S
        assert not hub.up and hub.lost_since is not None
        assert "live bus lost (redis did not answer a ping in 0.5 s)" in caplog.text

        while not hub.up:  # the pause ends: the hub's reader opens again
            await asyncio.sleep(0.1)
        assert "live bus reachable again" in caplog.text
        await _outboxes_drained()
        # The other process's publishes that waited on the paused Redis may now arrive: an event is
        # never sent twice (its seq), a metrics batch may be (docs/dashboard.md: the charts key by step).
        # New points come live again (one may still be read by the poll the hub's resync asked for).
        step = 3
        while True:
            step += 1
            assert step < 20, "no point came through the bus again"
            await ingest(run_id=run.pk, points=[Point("k", step, 0.1 * step, 1.0 + step)])
            while True:
                msg = await take()
                if msg["kind"] == "event":
                    pytest.fail(f"an event sent twice: {msg}")
                assert msg["kind"] == "metrics" and set(msg["series"]["k"]["steps"]) <= set(
                    range(1, step + 1)
                )
                if step in msg["series"]["k"]["steps"]:
                    break
            if "source" not in msg:
                break  # live again
    finally:
        await comm.disconnect()
        await _outboxes_drained()
        await admin.aclose()


@pytest.mark.timeout(60)
async def test_an_idle_reader_pings_once_per_silent_bound_not_in_a_loop(settings, private_redis):
    """After a subscription's confirmation (or a pong) the reader used to read with a timeout of 0 and
    ping again at once: Redis got tens of thousands of PINGs a second from an idle web process."""
    settings.LIVE_BUS_SILENT_S = 1.0
    admin = redis.asyncio.Redis.from_url(private_redis.url)
    reader = RedisBus(private_redis.url, "rlp").reader()

    async def pings() -> int:
        stats = await admin.info("commandstats")
        return int(stats.get("cmdstat_ping", {}).get("calls", 0))

    await reader.reopen({1})
    receiving = asyncio.create_task(reader.receive())
    try:
        await reader.listen(2)  # its confirmation arrives in the pending receive
        before = await pings()
        await asyncio.sleep(3.0)
        assert not receiving.done()  # nothing to return, no failure: still waiting
        assert 1 <= await pings() - before <= 5  # about one a second
    finally:
        receiving.cancel()
        await asyncio.gather(receiving, return_exceptions=True)
        await reader.close()
        await admin.aclose()


@pytest.mark.timeout(120)
async def test_a_receive_cancelled_while_its_read_times_out_ends(settings, private_redis):
    """The hub stops its reader task by cancelling it and waiting for it (its last follower left).
    redis-py's timed read sometimes ends as if it had timed out although the task was cancelled meanwhile;
    with reads of LIVE_BUS_SILENT_S that race is common: the receive must still end (the follower's
    disconnect waited for it forever). Cancelled at random moments of reads of 10 ms."""
    settings.LIVE_BUS_SILENT_S = 0.01
    rng = random.Random(20261207)
    reader = RedisBus(private_redis.url, "rlp").reader()
    try:
        await reader.reopen({1})
        for attempt in range(150):
            receiving = asyncio.create_task(reader.receive())
            await asyncio.sleep(rng.uniform(0, 0.05))
            receiving.cancel()
            done, _ = await asyncio.wait([receiving], timeout=5)
            assert done, f"attempt {attempt}: the cancelled receive went on reading"
            if not receiving.cancelled():  # (it failed: a read cut by the cancellation left the connection)
                await reader.reopen({1})
    finally:
        await reader.close()


@pytest.mark.timeout(90)
async def test_a_lost_bus_is_reported_reachable_again_even_when_its_followers_left_meanwhile(
    settings, private_redis, caplog
):
    """The bus goes away while a run is followed; the follower leaves before Redis is back (the hub
    stops reading: no follower waits); Redis comes back and a follower comes: the hub's log says the bus
    was still unreachable when the last follower left, then that it is reachable again. It used to say
    "live bus lost" and nothing more: the loss was remembered by the reader task, which ends with the
    last follower, and the next follower's reader opened without a word."""
    caplog.set_level(logging.INFO, logger="tracking.hub")
    hub = LiveHub(RedisBus(private_redis.url, "rlp"))
    inbox = Inbox()
    assert await hub.subscribe(7, inbox)
    private_redis.stop()  # the reader's connection is reset
    while hub.up:
        await asyncio.sleep(0.05)
    assert "live bus lost" in caplog.text
    await hub.unsubscribe(7, inbox)  # the last follower leaves while the bus is away
    private_redis.start()
    again = Inbox()
    try:
        assert await hub.subscribe(8, again)
        lines = [r.getMessage() for r in caplog.records if r.name == "tracking.hub"]

        def first(text: str) -> int | None:
            return next((i for i, line in enumerate(lines) if text in line), None)

        lost, left, back = (
            first("live bus lost"),
            first("as the last live follower left"),
            first("reachable again"),
        )
        assert None not in (lost, left, back) and lost < left < back, lines  # type: ignore[operator]
        assert hub.lost_since is None
    finally:
        await hub.unsubscribe(8, again)

"""The run websocket (tracking/consumers.py) through the real ASGI stack: session auth, catch-up by seq,
live forwarding of published messages, gap repair, and the database poll that covers the in-process
live bus. Real database (transactional: the consumer reads from other threads), real live bus."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import Client
from pydantic import TypeAdapter

from accounts.models import Role
from accounts.services import project_create
from config.asgi import application
from experiments.models import Run
from rl_engine import wire
from tests.conftest import REPO_ROOT, child_process_env
from tests.factories import ExperimentFactory, MembershipFactory, RunFactory, UserFactory
from tracking.bus import live_bus
from tracking.models import MetricPoint, RunEvent
from tracking.services import Point, event_payload, events_append, metrics_ingest

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


LIVE_MESSAGE = TypeAdapter(wire.LiveMessage)


class WireCheckedCommunicator(WebsocketCommunicator):
    """Every message the consumer sends must be one that ``rl_engine.wire`` describes (``LiveMessage``)."""

    async def receive_json_from(self, timeout: float = 1) -> Any:
        message = await super().receive_json_from(timeout)
        LIVE_MESSAGE.validate_python(message)
        return message


def communicator(run_id: int, cookie: bytes | None, last_seq: int | None = None) -> WebsocketCommunicator:
    path = f"/ws/runs/{run_id}/" + (f"?last_seq={last_seq}" if last_seq is not None else "")
    headers = [(b"origin", b"http://localhost")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WireCheckedCommunicator(application, path, headers=headers)


@pytest_asyncio.fixture(autouse=True)
async def close_thread_connections():
    """The consumer's DB reads run on asgiref's sync thread; with CONN_MAX_AGE (production settings) its
    connection would outlive the test and block dropping the test database."""
    yield
    await database_sync_to_async(connections.close_all)()


@pytest.fixture
def no_poll(settings):
    settings.LIVE_POLL_INTERVAL_S = 0  # prove the live bus's path alone


@pytest.fixture
def fast_poll(settings):
    settings.LIVE_POLL_INTERVAL_S = 0.2


@pytest.fixture
def setup(transactional_db):
    owner = UserFactory(username="owner")
    project = project_create(name="alpha", user=owner)
    viewer = MembershipFactory(project=project, role=Role.VIEWER, user=UserFactory(username="viewer")).user
    stranger = UserFactory(username="stranger")
    project_create(name="beta", user=stranger)
    run = RunFactory(experiment=ExperimentFactory(project=project))
    for i in range(3):
        events_append(run_id=run.pk, kind="log", message=f"line {i + 1}")
    users = {"owner": owner, "viewer": viewer, "stranger": stranger}
    return {"run": run, **users, "cookie": {name: session_cookie(u) for name, u in users.items()}}


async def receive_events(comm: WebsocketCommunicator, n: int, timeout: float = 3.0) -> list[dict]:
    """The next ``n`` event messages (skipping metrics/hello)."""
    out = []
    while len(out) < n:
        msg = await comm.receive_json_from(timeout=timeout)
        if msg["kind"] == "event":
            out.append(msg["event"])
    return out


async def test_stranger_and_anonymous_are_refused(setup, no_poll):
    run = setup["run"]
    for cookie in (setup["cookie"]["stranger"], None):
        comm = communicator(run.pk, cookie)
        connected, _ = await comm.connect()
        assert not connected
        await comm.disconnect()


async def test_unknown_run_is_refused(setup, no_poll):
    comm = communicator(setup["run"].pk + 999, setup["cookie"]["owner"])
    connected, _ = await comm.connect()
    assert not connected
    await comm.disconnect()


async def test_member_gets_hello_then_every_event_after_last_seq(setup, no_poll):
    run = setup["run"]
    comm = communicator(run.pk, setup["cookie"]["viewer"], last_seq=1)
    connected, _ = await comm.connect()
    assert connected
    hello = await comm.receive_json_from(timeout=3)
    assert hello["kind"] == "hello"
    assert hello["run"]["id"] == run.pk and hello["run"]["state"] == "queued"
    assert hello["run"]["last_seq"] == 3
    events = await receive_events(comm, 2)
    assert [e["seq"] for e in events] == [2, 3]
    assert [e["message"] for e in events] == ["line 2", "line 3"]
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


async def test_resume_message_replays_from_the_given_seq(setup, no_poll):
    comm = communicator(setup["run"].pk, setup["cookie"]["owner"])
    assert (await comm.connect())[0]
    await comm.receive_json_from(timeout=3)  # hello
    assert [e["seq"] for e in await receive_events(comm, 3)] == [1, 2, 3]
    await comm.send_json_to({"type": "resume", "last_seq": 2})
    assert [e["seq"] for e in await receive_events(comm, 1)] == [3]
    await comm.send_json_to({"type": "resume", "last_seq": "x"})
    err = await comm.receive_json_from(timeout=3)
    assert err["kind"] == "error" and "last_seq" in err["message"]
    await comm.send_to(text_data="not json")  # answered, and the stream stays open
    err = await comm.receive_json_from(timeout=3)
    assert err["kind"] == "error" and "JSON" in err["message"]
    await comm.send_json_to({"type": "resume", "last_seq": 0})
    assert [e["seq"] for e in await receive_events(comm, 3)] == [1, 2, 3]
    await comm.disconnect()


async def test_a_reconnect_several_catch_up_batches_behind_gets_every_missed_event_in_order(setup, no_poll):
    """A browser that was away for more than one catch-up batch (CATCH_UP_BATCH events) reconnects with
    its last_seq: every event after it arrives, in order, once, across several database reads, with no
    live message to trigger more reads; the events stored after that follow without a gap."""
    from tracking.consumers import CATCH_UP_BATCH
    from tracking.services import NewEvent, events_append_many

    run = setup["run"]  # seq 1..3 exist
    missed = 3 * CATCH_UP_BATCH + 7
    await database_sync_to_async(events_append_many)(
        run_id=run.pk, events=[NewEvent(kind="log", message=f"missed {i}") for i in range(missed)]
    )
    comm = communicator(run.pk, setup["cookie"]["viewer"], last_seq=2)
    connected, _ = await comm.connect()
    assert connected
    assert (await comm.receive_json_from(timeout=5))["kind"] == "hello"
    caught_up = await receive_events(comm, 1 + missed, timeout=20)  # nothing else happens meanwhile
    assert await comm.receive_nothing(timeout=0.5)  # (a catch-up that stopped early stops here)
    for i in range(3):
        await database_sync_to_async(events_append)(run_id=run.pk, kind="log", message=f"live {i}")
    live = await receive_events(comm, 3, timeout=10)
    seqs = [e["seq"] for e in caught_up + live]
    assert seqs == list(range(3, 3 + missed + 1 + 3))  # 3, the missed ones, the live ones: no gap, no repeat
    stored = await database_sync_to_async(
        lambda: list(
            RunEvent.objects.filter(run=run, seq__gte=3).order_by("seq").values_list("message", flat=True)
        )
    )()
    assert [e["message"] for e in caught_up + live] == stored
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


async def test_published_event_and_metrics_are_forwarded_live(setup, no_poll):
    run = setup["run"]
    comm = communicator(run.pk, setup["cookie"]["owner"], last_seq=3)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    # The services store first, then publish on commit through tracking.live (the real live bus).
    await database_sync_to_async(events_append)(
        run_id=run.pk, kind="status", message="queued → starting", data={"from": "queued", "to": "starting"}
    )
    event = (await receive_events(comm, 1))[0]
    assert event["seq"] == 4 and event["kind"] == "status" and event["data"]["to"] == "starting"
    await database_sync_to_async(metrics_ingest)(
        run_id=run.pk, points=[Point("reward/mean", 1, 0.25, 1.0), Point("reward/mean", 2, 0.5, 2.0)]
    )
    msg = await comm.receive_json_from(timeout=3)
    assert msg["kind"] == "metrics"
    assert msg["series"]["reward/mean"]["steps"] == [1, 2]
    assert msg["series"]["reward/mean"]["values"] == [0.25, 0.5]
    await comm.disconnect()


async def test_only_points_actually_stored_are_shown_live(setup, no_poll):
    """A retried point with another value is ignored by the database (first value wins): the live
    stream must not show the value the database does not hold."""
    run = setup["run"]
    comm = communicator(run.pk, setup["cookie"]["owner"], last_seq=3)
    assert (await comm.connect())[0]
    await comm.receive_json_from(timeout=3)  # hello
    ingest = database_sync_to_async(metrics_ingest)
    await ingest(run_id=run.pk, points=[Point("reward/mean", 1, 0.25, 1.0)])
    first = await comm.receive_json_from(timeout=3)
    await ingest(run_id=run.pk, points=[Point("reward/mean", 1, 9.0, 1.5), Point("reward/mean", 2, 0.5, 2.0)])
    second = await comm.receive_json_from(timeout=3)
    await ingest(run_id=run.pk, points=[Point("reward/mean", 2, 7.0, 2.5)])  # nothing new: nothing sent
    assert await comm.receive_nothing(timeout=0.5)
    assert first["series"]["reward/mean"] == {"steps": [1], "values": [0.25], "wall_times": [1.0]}
    assert second["series"]["reward/mean"] == {"steps": [2], "values": [0.5], "wall_times": [2.0]}
    assert second["count"] == 1
    await comm.disconnect()


async def test_a_batch_whose_live_message_was_lost_comes_from_the_poll_and_no_point_twice(
    setup, fast_poll, monkeypatch
):
    """The bus carries every batch but one (its publish never left the process): the poll finds the
    run's batch counter ahead of what arrived, and sends that batch's points, and only those, while the
    other batches keep arriving live. Reference: every point the database holds, each received once."""
    from tracking import live

    run = setup["run"]
    comm = communicator(run.pk, setup["cookie"]["owner"], last_seq=3)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    ingest = database_sync_to_async(metrics_ingest)
    publish = live.publish
    await ingest(run_id=run.pk, points=[Point("loss", s, 0.5, 1.0) for s in range(5)])
    monkeypatch.setattr(live, "publish", lambda *args, **kwargs: False)  # this batch's message is lost
    lost = [Point("loss", s, 0.5, 1.0) for s in range(5, 9)] + [Point("reward", 7, 1.0, 1.0)]
    await ingest(run_id=run.pk, points=lost)
    monkeypatch.setattr(live, "publish", publish)
    for i in range(12):  # live batches across several polls (one every 0.2 s)
        await ingest(run_id=run.pk, points=[Point("loss", 9 + 2 * i + j, 0.5, 1.0) for j in range(2)])
        await asyncio.sleep(0.1)

    def stored_points() -> set[tuple[str, int]]:
        return set(MetricPoint.objects.filter(run=run).values_list("key", "step"))

    stored = await database_sync_to_async(stored_points)()
    received: list[tuple[str, int]] = []
    by_poll: set[tuple[str, int]] = set()
    while len(received) < len(stored):
        msg = await comm.receive_json_from(timeout=5)
        assert msg["kind"] == "metrics"
        got = [(key, step) for key, s in msg["series"].items() for step in s["steps"]]
        received += got
        if msg.get("source") == "poll":
            by_poll.update(got)
    assert await comm.receive_nothing(timeout=1.0)  # five more polls: nothing else, nothing again
    assert sorted(received) == sorted(stored)  # every point, each once
    assert by_poll == {(p.key, p.step) for p in lost}
    await comm.disconnect()


async def announce(run_id: int, payload: Any) -> None:
    """Publish ``payload`` to the run's followers as another process does, without storing it."""
    from tracking import live

    await live_bus().publish(live.LiveMessage(run_id, payload, []).envelope())


async def test_published_event_that_skips_ahead_is_preceded_by_the_gap_from_the_database(setup, no_poll):
    run = setup["run"]
    comm = communicator(run.pk, setup["cookie"]["owner"], last_seq=3)
    assert (await comm.connect())[0]
    await comm.receive_json_from(timeout=3)

    def store_two_quietly() -> RunEvent:
        # Rows another process stored (its publish never reached this process): only the second is announced.
        RunEvent.objects.create(run=run, seq=4, kind="log", message="lost")
        Run.objects.filter(pk=run.pk).update(event_seq=5)
        return RunEvent.objects.create(run=run, seq=5, kind="log", message="announced")

    fifth = await database_sync_to_async(store_two_quietly)()
    payload = await database_sync_to_async(event_payload)(fifth)
    await announce(run.pk, payload)
    events = await receive_events(comm, 2)
    assert [(e["seq"], e["message"]) for e in events] == [(4, "lost"), (5, "announced")]
    # A repeat of an event already sent is dropped.
    await announce(run.pk, payload)
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


async def test_poll_delivers_what_another_process_stored_without_a_shared_bus(setup, fast_poll):
    """A Celery worker on the in-process bus cannot reach us: the consumer's DB poll must."""
    run = setup["run"]
    comm = communicator(run.pk, setup["cookie"]["owner"], last_seq=3)
    assert (await comm.connect())[0]
    await comm.receive_json_from(timeout=3)
    env = child_process_env()
    env.pop("REDIS_URL", None)  # the child's bus is in-process: its publish goes nowhere
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    code = (
        "import django; django.setup()\n"
        "from experiments.services import run_transition\n"
        "from tracking.services import Point, metrics_ingest\n"
        f"run_transition(run_id={run.pk}, to='starting')\n"
        f"metrics_ingest(run_id={run.pk}, points=[Point('actor/pg_loss', 7, -0.5, 1.0)])\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE
    )
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    got_event, got_metric = None, None
    for _ in range(20):
        msg = await comm.receive_json_from(timeout=5)
        if msg["kind"] == "event":
            got_event = msg["event"]
        elif msg["kind"] == "metrics":
            got_metric = msg
        if got_event and got_metric:
            break
    assert got_event["seq"] == 4 and got_event["data"] == {"from": "queued", "to": "starting"}
    assert got_metric["source"] == "poll"
    assert got_metric["series"]["actor/pg_loss"]["steps"] == [7]
    assert got_metric["series"]["actor/pg_loss"]["values"] == [-0.5]
    await comm.disconnect()


async def test_an_idle_socket_on_redis_stays_open_past_10_s_then_receives(setup, no_poll, redis_url, caplog):
    """An idle hub's reader waits on Redis in reads of HEALTH_S and pings when nothing came: a read that
    timed out used to end an idle socket after 5 s (a socket timeout equal to the blocking read), and a
    ping left unanswered would mark the bus lost (the log shows it). Idle for 11 s (two health checks),
    then live, no fallback."""
    from tracking.bus import HEALTH_S, RedisBus

    assert isinstance(live_bus(), RedisBus) and 2 * HEALTH_S < 11  # the production bus, on the real Redis
    run = setup["run"]
    comm = communicator(run.pk, setup["cookie"]["owner"], last_seq=3)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    assert await comm.receive_nothing(timeout=11)  # no close frame, no error: still open
    await database_sync_to_async(events_append)(run_id=run.pk, kind="log", message="after the silence")
    event = (await receive_events(comm, 1, timeout=5))[0]
    assert (event["seq"], event["message"]) == (4, "after the silence")
    await comm.disconnect()
    assert "live bus lost" not in caplog.text


async def test_the_stream_survives_the_bus_going_away_and_listens_again_when_it_returns(
    setup, settings, tmp_path, monkeypatch
):
    """Redis (a private server: the shared one is never stopped) goes away under an open socket: the
    consumer stays open and follows the database; when Redis is back the hub subscribes to the run
    again (a restarted Redis forgot it) and live messages flow. No point is lost or sent twice. The data
    is published by another web process (its own bus: a process's own followers get its messages
    without the bus)."""
    from harness.private_redis import PrivateRedis, require_redis_server
    from tracking import live
    from tracking.bus import RedisBus

    require_redis_server()
    redis = PrivateRedis(tmp_path)
    redis.start()
    settings.LIVE_BUS = {"url": redis.url, "prefix": "rlp"}
    publisher = RedisBus(redis.url, "rlp")  # another process's
    monkeypatch.setattr(live, "live_bus", lambda: publisher)
    settings.LIVE_POLL_INTERVAL_S = 0  # as deployed with Redis: no poll while the bus works
    run = setup["run"]
    ingest = database_sync_to_async(metrics_ingest)
    try:
        comm = communicator(run.pk, setup["cookie"]["owner"], last_seq=3)
        assert (await comm.connect())[0]
        assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
        redis.stop()
        # Stored while the bus is down: the publish fails (logged), the consumer's fallback poll delivers.
        await database_sync_to_async(events_append)(run_id=run.pk, kind="log", message="during the outage")
        await ingest(run_id=run.pk, points=[Point("reward/mean", 0, 0.1, 1.0)])
        steps: list[int] = []
        sources: list[str] = []
        event = None
        while event is None or not steps:
            msg = await comm.receive_json_from(timeout=10)
            if msg["kind"] == "event":
                event = msg["event"]
            elif msg["kind"] == "metrics":
                steps += msg["series"]["reward/mean"]["steps"]
                sources.append(msg.get("source", "live"))
        assert (event["seq"], event["message"]) == (4, "during the outage")
        assert steps == [0] and sources == ["poll"]
        redis.start()  # same port, empty: the subscription is gone
        step = 0
        while "live" not in sources:  # until a message comes through the bus again (not the poll)
            step += 1
            assert step < 60, "the hub did not listen to the bus again within 30 s"
            await ingest(run_id=run.pk, points=[Point("reward/mean", step, 0.1, 1.0)])
            # (a receive that times out would cancel the consumer: wait with receive_nothing instead)
            while not await comm.receive_nothing(timeout=0.5):
                msg = await comm.receive_json_from(timeout=3)
                if msg["kind"] == "metrics":
                    steps += msg["series"]["reward/mean"]["steps"]
                    sources.append(msg.get("source", "live"))
        assert sorted(set(steps)) == list(range(step + 1))  # every point: resync catch-up plus live
        await comm.disconnect()
    finally:
        redis.stop()


async def test_the_first_publish_after_a_redis_restart_reaches_the_followers(tmp_path):
    """A publisher keeps its pooled connections across a Redis restart, and the first command on each
    fails ("Connection closed by server"): the publish tries once more on a fresh connection, so a web
    process does not lose its first live message after every restart (found by the production stack's
    two-process test); the same for a Celery worker's publish. Publisher and reader are separate buses,
    as they are separate processes in production."""
    from harness.private_redis import PrivateRedis, require_redis_server
    from tracking.bus import BusUnavailable, Envelope, RedisBus

    require_redis_server()
    redis = PrivateRedis(tmp_path)
    redis.start()
    publisher, reader = RedisBus(redis.url, "rlp"), RedisBus(redis.url, "rlp").reader()

    def envelope(n: int) -> Envelope:
        return Envelope(run_id=1, kind="event", text=f'{{"n": {n}}}', seq=n)

    try:
        await reader.reopen({1})
        await publisher.publish(envelope(1))
        await asyncio.to_thread(publisher.publish_sync, envelope(2))
        assert [e.seq for e in await reader.receive()] in ([1, 2], [1])
        redis.stop()
        redis.start()  # same port, empty: the subscription is gone, the publisher's connections are dead
        with pytest.raises(BusUnavailable):
            while True:  # the reader notices (its hub then reopens it)
                await asyncio.wait_for(reader.receive(), 15)
        await reader.reopen({1})
        await publisher.publish(envelope(3))
        await asyncio.to_thread(publisher.publish_sync, envelope(4))
        got: list[int] = []
        while len(got) < 2:
            got += [e.seq for e in await asyncio.wait_for(reader.receive(), 10) if e.seq > 2]
        assert got == [3, 4]
    finally:
        await reader.close()
        redis.stop()

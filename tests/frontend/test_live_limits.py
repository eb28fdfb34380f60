"""What one viewer can make a web process do through the run websocket (tracking/consumers.py), bounded:
a burst of resume frames costs about one catch-up (one in flight per socket, client messages
rate-limited), at most LIVE_MAX_SOCKETS_PER_USER_RUN streams of a run per user (one more: 4429), and a
run id that is not one (non-ASCII digits, past a bigint) is refused with 4403 like an unknown run. Real
ASGI stack, database and live bus, as in test_consumers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from accounts.services import token_create
from config.asgi import application
from tests.frontend.test_consumers import (  # noqa: F401  (fixtures: setup, no_poll; autouse: close_thread_connections)
    close_thread_connections,
    communicator,
    no_poll,
    receive_events,
    setup,
)
from tracking import consumers
from tracking.services import NewEvent, events_append_many

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def drain(comm: WebsocketCommunicator, quiet_s: float = 1.0) -> list[dict[str, Any]]:
    """Every message until none came for ``quiet_s``."""
    out = []
    while not await comm.receive_nothing(timeout=quiet_s):
        out.append(await comm.receive_json_from(timeout=5))
    return out


async def test_twenty_resume_frames_cost_about_one_catch_up(setup, no_poll):  # noqa: F811
    """20 ``{"type": "resume", "last_seq": 0}`` frames once made the consumer read and send every event
    20 times over (40,020 messages for a run of 2,000 events, seconds of the process's shared database
    thread). Now the first starts a catch-up, those that arrive while it runs join it, and those past
    the rate limit get an error: the events come once (twice at most), in order."""
    run = setup["run"]  # seq 1..3
    await database_sync_to_async(events_append_many)(
        run_id=run.pk, events=[NewEvent(kind="log", message=f"e{i}") for i in range(1200)]
    )
    total = 1203
    comm = communicator(run.pk, setup["cookie"]["viewer"], last_seq=total)  # nothing to catch up at connect
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=5))["kind"] == "hello"
    for _ in range(20):
        await comm.send_json_to({"type": "resume", "last_seq": 0})
    got = await drain(comm)
    seqs = [m["event"]["seq"] for m in got if m["kind"] == "event"]
    errors = [m["message"] for m in got if m["kind"] == "error"]
    assert seqs[:total] == list(range(1, total + 1))  # the first catch-up: every event, in order
    assert len(seqs) <= 2 * total, f"{len(seqs)} events sent for 20 resumes of {total}"
    assert len(errors) >= 20 - consumers.CLIENT_MESSAGE_BURST
    assert all("too many messages" in e for e in errors)
    assert len(got) == len(seqs) + len(errors)
    await comm.disconnect()


async def test_client_messages_past_the_rate_get_an_error_and_nothing_else(setup, no_poll, settings):  # noqa: F811
    settings.LIVE_CLIENT_MESSAGE_BURST = 2
    settings.LIVE_CLIENT_MESSAGE_REFILL_S = 0.5
    comm = communicator(setup["run"].pk, setup["cookie"]["owner"], last_seq=3)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    for seq in (2, 1, 0):
        await comm.send_json_to({"type": "resume", "last_seq": seq})
    got = await drain(comm, quiet_s=0.3)
    assert [m["kind"] for m in got].count("error") == 1 and "too many messages" in got[-1]["message"]
    assert sorted(m["event"]["seq"] for m in got if m["kind"] == "event") == [2, 3, 3]
    await asyncio.sleep(0.6)  # a token came back
    await comm.send_json_to({"type": "resume", "last_seq": 2})
    assert [e["seq"] for e in await receive_events(comm, 1)] == [3]
    await comm.disconnect()


async def test_a_resume_arriving_during_a_catch_up_joins_it_or_is_read_once_after_it(
    setup,  # noqa: F811
    no_poll,  # noqa: F811
    monkeypatch,
    settings,
):
    """While a resume's catch-up waits on the database, resumes from later seqs join it (it sends every
    event after its start) and resumes from earlier seqs are read once after it, from the earliest."""
    settings.LIVE_CLIENT_MESSAGE_BURST = 10  # (five resumes at once: none refused)
    run = setup["run"]
    await database_sync_to_async(events_append_many)(
        run_id=run.pk, events=[NewEvent(kind="log", message=f"e{i}") for i in range(5)]
    )  # seq 1..8
    comm = communicator(run.pk, setup["cookie"]["owner"], last_seq=8)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    gate, reads = asyncio.Event(), []
    real = consumers.events_after

    async def gated(run_id: int, seq: int, *args: Any) -> Any:
        reads.append(seq)
        await gate.wait()
        return await real(run_id, seq, *args)

    monkeypatch.setattr(consumers, "events_after", gated)
    await comm.send_json_to({"type": "resume", "last_seq": 5})
    while not reads:  # the catch-up waits on its first read
        await asyncio.sleep(0.01)
    for seq in (6, 3, 2, 7):  # 6 and 7 join it; 3 and 2 make one more, from 2
        await comm.send_json_to({"type": "resume", "last_seq": seq})
    await asyncio.sleep(0.3)  # (the four were handled: each a membership check on the database)
    gate.set()
    got = await drain(comm, quiet_s=0.5)
    assert [m["event"]["seq"] if m["kind"] == "event" else m for m in got] == [6, 7, 8, 3, 4, 5, 6, 7, 8]
    assert reads == [5, 2]  # two catch-ups (each one read: fewer than CATCH_UP_BATCH events)
    await comm.disconnect()


async def test_sockets_past_the_cap_per_user_and_run_are_refused_with_4429(setup, no_poll, settings):  # noqa: F811
    """200 sockets of one run were accepted from one viewer. The cap counts per user and run: another
    user, or another run, is not held back, and a socket that closes gives its place back."""
    settings.LIVE_MAX_SOCKETS_PER_USER_RUN = 3
    run = setup["run"]
    opened = []
    for _ in range(3):
        comm = communicator(run.pk, setup["cookie"]["viewer"], last_seq=3)
        assert (await comm.connect())[0]
        assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
        opened.append(comm)
    for _ in range(2):
        extra = communicator(run.pk, setup["cookie"]["viewer"], last_seq=3)
        assert await extra.connect() == (False, consumers.CLOSE_TOO_MANY)
        await extra.disconnect()
    owner = communicator(run.pk, setup["cookie"]["owner"], last_seq=3)
    assert (await owner.connect())[0]  # another user: their own count
    await opened.pop().disconnect()
    again = communicator(run.pk, setup["cookie"]["viewer"], last_seq=3)
    assert (await again.connect())[0]  # a place came back
    assert (await again.receive_json_from(timeout=3))["kind"] == "hello"
    for comm in [*opened, owner, again]:
        await comm.disconnect()
    assert not consumers._streams_here()  # every place given back


async def test_the_default_cap_is_eight(setup, no_poll):  # noqa: F811
    run = setup["run"]
    comms = [communicator(run.pk, setup["cookie"]["viewer"], last_seq=3) for _ in range(9)]
    results = [await comm.connect() for comm in comms]
    assert [ok for ok, _ in results] == [True] * 8 + [False] and results[-1][1] == 4429
    for comm in comms:
        await comm.disconnect()


@pytest.mark.parametrize(
    "segment",
    [str(2**63), "99999999999999999999", "%C2%B2", "%D9%A1", "0", "-1", "1_0", "x"],
    ids=["2**63", "20 nines", "superscript two", "arabic-indic one", "zero", "minus one", "1_0", "x"],
)
async def test_a_run_id_that_is_not_one_is_refused_with_4403(setup, no_poll, segment):  # noqa: F811
    comm = WebsocketCommunicator(
        application,
        f"/ws/runs/{segment}/",
        headers=[(b"origin", b"http://localhost"), (b"cookie", setup["cookie"]["owner"])],
    )
    assert await comm.connect() == (False, consumers.CLOSE_FORBIDDEN)
    await comm.disconnect()


async def test_a_token_stream_of_a_run_id_that_is_not_one_is_refused_with_4403(setup, no_poll):  # noqa: F811
    owner, project = setup["owner"], setup["run"].project
    scoped = await database_sync_to_async(token_create)(user=owner, name="t", project=project)
    broad = await database_sync_to_async(token_create)(user=owner, name="u")
    for secret in (scoped.secret, broad.secret):
        comm = WebsocketCommunicator(
            application,
            f"/ws/runs/{2**63}/",
            headers=[(b"origin", b"http://localhost"), (b"authorization", f"Token {secret}".encode())],
        )
        connected, _ = await comm.connect()
        assert connected  # a token connection is accepted, then closed with a code
        assert await comm.receive_output(timeout=3) == {"type": "websocket.close", "code": 4403}
        await comm.disconnect()


async def test_last_seq_in_the_url_that_is_not_a_number_counts_as_zero(setup, no_poll):  # noqa: F811
    for raw in ("%C2%B2", "%D9%A1", str(2**64), "-5"):
        comm = WebsocketCommunicator(
            application,
            f"/ws/runs/{setup['run'].pk}/?last_seq={raw}",
            headers=[(b"origin", b"http://localhost"), (b"cookie", setup["cookie"]["owner"])],
        )
        assert (await comm.connect())[0]
        assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
        assert [e["seq"] for e in await receive_events(comm, 3)] == [1, 2, 3], raw
        await comm.disconnect()

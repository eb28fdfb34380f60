"""The run websocket re-checks membership after the handshake: a member removed from the project (or a
deactivated user) is disconnected with 4403 at the next poll, also with database polling off, and on
their next message. The same rule holds for a script that
authenticates with an API token (tracking/ws_auth.py): refused tokens are closed with 4401, non-members
with 4403. Real ASGI stack, database and live bus."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async
from django.db import connections

from accounts.models import Membership, Role
from accounts.services import project_create
from tests.factories import ExperimentFactory, MembershipFactory, RunFactory, UserFactory
from tests.frontend.test_consumers import communicator, session_cookie
from tracking import consumers

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest_asyncio.fixture(autouse=True)
async def close_thread_connections():
    yield
    await database_sync_to_async(connections.close_all)()


@pytest.fixture
def world(transactional_db):
    owner = UserFactory(username="owner")
    project = project_create(name="alpha", user=owner)
    viewer = MembershipFactory(project=project, role=Role.VIEWER, user=UserFactory(username="viewer")).user
    run = RunFactory(experiment=ExperimentFactory(project=project))
    return {"run": run, "viewer": viewer, "cookie": session_cookie(viewer)}


async def connected(world):
    comm = communicator(world["run"].pk, world["cookie"])
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    return comm


async def closed_with(comm, timeout: float = 5.0) -> int | None:
    """The close code the server ends the stream with (other messages skipped)."""
    while True:
        message = await comm.receive_output(timeout=timeout)
        if message["type"] == "websocket.close":
            return message.get("code")


remove_membership = database_sync_to_async(
    lambda world: Membership.objects.filter(user=world["viewer"], project=world["run"].project).delete()
)


deactivate = database_sync_to_async(
    lambda user: type(user).objects.filter(pk=user.pk).update(is_active=False)
)


async def test_a_removed_member_is_disconnected_at_the_next_poll(world, settings):
    settings.LIVE_POLL_INTERVAL_S = 0.2
    comm = await connected(world)
    await remove_membership(world)
    assert await closed_with(comm) == consumers.CLOSE_FORBIDDEN
    await comm.disconnect()


async def test_a_deactivated_user_is_disconnected_also_with_database_polling_off(
    world, settings, monkeypatch
):
    settings.LIVE_POLL_INTERVAL_S = 0
    monkeypatch.setattr(consumers, "MEMBERSHIP_RECHECK_S", 0.2)
    comm = await connected(world)
    assert await comm.receive_nothing(timeout=0.5)  # still a member: the stream stays open
    await deactivate(world["viewer"])
    assert await closed_with(comm) == consumers.CLOSE_FORBIDDEN
    await comm.disconnect()


async def test_a_message_from_a_removed_member_closes_the_stream(world, settings):
    settings.LIVE_POLL_INTERVAL_S = 600  # no poll in this test's lifetime: the message triggers the check
    comm = await connected(world)
    await remove_membership(world)
    await comm.send_json_to({"type": "resume", "last_seq": 0})
    assert await closed_with(comm) == consumers.CLOSE_FORBIDDEN
    await comm.disconnect()


def _log_out(cookie: bytes) -> int:
    """Log out the browser session of ``cookie`` the way a browser does (POST to the logout page)."""
    from django.test import Client

    browser = Client()
    browser.cookies["sessionid"] = cookie.decode().split("=", 1)[1]
    return browser.post("/accounts/logout/").status_code


def _change_password(user) -> None:
    user.set_password("a-new-password-for-tests")
    user.save()


@pytest.mark.parametrize("end_session", ["logout", "password change"])
async def test_a_stream_ends_with_its_session_logout_or_password_change(
    world, settings, monkeypatch, end_session
):
    settings.LIVE_POLL_INTERVAL_S = 0
    monkeypatch.setattr(consumers, "MEMBERSHIP_RECHECK_S", 0.2)
    comm = await connected(world)
    assert await comm.receive_nothing(timeout=0.5)  # a valid session: the stream stays open
    if end_session == "logout":
        assert await database_sync_to_async(_log_out)(world["cookie"]) in (200, 302)
    else:
        await database_sync_to_async(_change_password)(world["viewer"])
    assert await closed_with(comm) == consumers.CLOSE_FORBIDDEN
    await comm.disconnect()


# --- API tokens on the websocket (tracking/ws_auth.py) ------------------------------------------------

# The documented close codes (docs/api.md), written out: the contract, not the module's constants.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


def token_communicator(run_id: int, header: str | None, cookie: bytes | None = None):
    from channels.testing import WebsocketCommunicator

    from config.asgi import application

    headers = [(b"origin", b"http://localhost")]
    if header is not None:
        headers.append((b"authorization", header.encode()))
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)


# How long a handshake or an awaited message may take before the test gives up: a bound for a loaded
# machine (the token's check and the run's summary are database reads on a shared thread), not a
# timing the test asserts. Communicator.connect's default of 1 s failed under load.
SLOW_S = 30.0


async def close_code_of(comm) -> int | None:
    """Connect; the close code a refused token connection gets right after the accept (None: admitted).
    A token connection is always accepted first: a close before the accept would reach a real client as
    a bare HTTP 403 without the code."""
    connected, code = await comm.connect(timeout=SLOW_S)
    assert connected, f"refused at the handshake (close code {code} would be lost)"
    first = await comm.receive_output(timeout=SLOW_S)
    if first["type"] == "websocket.close":
        return first.get("code")
    assert json_kind(first) == "hello"
    return None


def json_kind(message: dict) -> str:
    import json

    return json.loads(message["text"])["kind"]


@pytest.fixture
def tokens(world):
    """Every kind of token against ``world``'s run: who the rule admits and who it refuses, and how."""
    from datetime import timedelta

    from django.utils import timezone

    from accounts.services import ingest_token_issue, token_create, token_revoke

    run = world["run"]
    project = run.project
    viewer = world["viewer"]
    stranger = UserFactory(username="stranger")
    other_project = project_create(name="beta", user=stranger)
    inactive = MembershipFactory(project=project, role=Role.MEMBER, user=UserFactory(username="gone")).user
    inactive_secret = token_create(user=inactive, name="t").secret
    type(inactive).objects.filter(pk=inactive.pk).update(is_active=False)
    revoked = token_create(user=viewer, name="revoked")
    token_revoke(token=revoked.token)
    owner = project.memberships.get(role=Role.OWNER).user
    return {
        "admitted": {
            "viewer": token_create(user=viewer, name="t").secret,
            "owner": token_create(user=owner, name="t").secret,
            "viewer, limited to the run's project": token_create(
                user=viewer, name="t", project=project
            ).secret,
        },
        CLOSE_UNAUTHENTICATED: {
            "unknown": "rlp_" + "x" * 40,
            "revoked": revoked.secret,
            "expired": token_create(
                user=viewer, name="t", expires_at=timezone.now() - timedelta(seconds=1)
            ).secret,
            "of a deactivated user": inactive_secret,
            "malformed header": None,  # "Token" and nothing else
        },
        CLOSE_FORBIDDEN: {
            "stranger": token_create(user=stranger, name="t").secret,
            "stranger, limited to their project": token_create(
                user=stranger, name="t", project=other_project
            ).secret,
            "owner, limited to another project": token_create(
                user=owner, name="t", project=project_create(name="gamma", user=owner)
            ).secret,
            "the run's ingest token": ingest_token_issue(run=run).secret,
        },
    }


async def test_token_handshake_follows_the_membership_rule_with_close_codes(world, tokens, settings):
    settings.LIVE_POLL_INTERVAL_S = 0
    run_id = world["run"].pk
    for expected, cases in tokens.items():
        for who, secret in cases.items():
            header = "Token" if secret is None else f"Token {secret}"
            comm = token_communicator(run_id, header)
            code = await close_code_of(comm)
            assert code == (None if expected == "admitted" else expected), who
            await comm.disconnect()
    # Bearer is the synonym the REST API accepts too; an unknown run looks like a foreign one.
    comm = token_communicator(run_id, f"Bearer {tokens['admitted']['viewer']}")
    assert await close_code_of(comm) is None
    await comm.disconnect()
    comm = token_communicator(run_id + 999, f"Token {tokens['admitted']['viewer']}")
    assert await close_code_of(comm) == CLOSE_FORBIDDEN
    await comm.disconnect()


async def test_a_token_wins_over_a_cookie_and_a_refused_token_is_not_saved_by_the_cookie(
    world, tokens, settings
):
    settings.LIVE_POLL_INTERVAL_S = 0
    comm = token_communicator(world["run"].pk, "Token rlp_unknown", cookie=world["cookie"])
    assert await close_code_of(comm) == CLOSE_UNAUTHENTICATED
    await comm.disconnect()


async def test_without_a_token_the_cookie_rule_is_unchanged(world, settings):
    settings.LIVE_POLL_INTERVAL_S = 0
    comm = token_communicator(world["run"].pk, None)  # neither: refused at the handshake, as before
    connected, _ = await comm.connect()
    assert not connected
    await comm.disconnect()


async def test_a_token_streams_the_same_events_as_a_cookie(world, tokens, settings):
    from tracking.services import events_append

    settings.LIVE_POLL_INTERVAL_S = 0
    await database_sync_to_async(events_append)(run_id=world["run"].pk, kind="log", message="hello there")
    comm = token_communicator(world["run"].pk, f"Token {tokens['admitted']['viewer']}")
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=3))["kind"] == "hello"
    event = await comm.receive_json_from(timeout=3)
    assert event["kind"] == "event" and event["event"]["message"] == "hello there"
    await comm.disconnect()


async def test_a_token_stream_stays_open_across_membership_rechecks(world, tokens, settings, monkeypatch):
    """A token stream has no browser session: the re-check must not take that for a logged-out session.
    Counted, not timed: the stream passes three re-checks, then still delivers an event."""
    from tracking.services import events_append

    settings.LIVE_POLL_INTERVAL_S = 0.2
    monkeypatch.setattr(consumers, "MEMBERSHIP_RECHECK_S", 0.1)
    verdicts: list[bool] = []
    recheck = consumers.RunConsumer.still_member

    async def counted(self) -> bool:
        verdicts.append(await recheck(self))
        return verdicts[-1]

    monkeypatch.setattr(consumers.RunConsumer, "still_member", counted)
    comm = token_communicator(world["run"].pk, f"Token {tokens['admitted']['viewer']}")
    assert await close_code_of(comm) is None

    async def rechecked(times: int) -> None:
        while len(verdicts) < times:
            await asyncio.sleep(0.05)

    await asyncio.wait_for(rechecked(3), SLOW_S)  # several polls, each re-checking membership
    assert all(verdicts), verdicts
    await database_sync_to_async(events_append)(run_id=world["run"].pk, kind="log", message="still here")
    message = await comm.receive_json_from(timeout=SLOW_S)
    assert message["kind"] == "event" and message["event"]["message"] == "still here"
    assert all(verdicts) and len(verdicts) >= 3
    await comm.disconnect()


async def test_a_token_member_removed_from_the_project_is_closed_with_4403(world, tokens, settings):
    settings.LIVE_POLL_INTERVAL_S = 0.2
    comm = token_communicator(world["run"].pk, f"Token {tokens['admitted']['viewer']}")
    assert await close_code_of(comm) is None
    await remove_membership(world)
    assert await closed_with(comm) == consumers.CLOSE_FORBIDDEN
    await comm.disconnect()


async def test_a_token_revoked_while_streaming_is_closed_with_4401(world, tokens, settings, monkeypatch):
    from accounts.models import ApiToken
    from accounts.services import hash_secret, token_revoke
    from tracking import ws_auth

    settings.LIVE_POLL_INTERVAL_S = 0.2  # the poll sends (metrics/events) or at least runs; we publish below
    monkeypatch.setattr(ws_auth, "TOKEN_RECHECK_S", 0.1)
    secret = tokens["admitted"]["viewer"]
    comm = token_communicator(world["run"].pk, f"Token {secret}")
    assert await close_code_of(comm) is None
    revoke = database_sync_to_async(
        lambda: token_revoke(token=ApiToken.objects.get(key_hash=hash_secret(secret)))
    )
    await revoke()
    from tracking.services import events_append

    await asyncio.sleep(0.2)
    await database_sync_to_async(events_append)(
        run_id=world["run"].pk, kind="log", message="after revocation"
    )
    assert await closed_with(comm) == CLOSE_UNAUTHENTICATED
    await comm.disconnect()

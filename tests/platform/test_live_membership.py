"""The run websocket re-checks membership after the handshake: a member removed from the project (or a
deactivated user) is disconnected with 4403 at the next poll, also with database polling off, and on
their next message. Real ASGI stack, database and channel layer."""

from __future__ import annotations

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

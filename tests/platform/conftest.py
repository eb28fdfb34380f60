"""Fixtures of the platform tests: users in each role of one project, API clients, a live-bus listener."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import uuid
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import Role
from accounts.services import project_create, token_create
from tests.factories import ExperimentFactory, MembershipFactory, UserFactory
from tracking.bus import Envelope, live_bus


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # PBKDF2's deliberate slowness would dominate these tests; hashing strength is not what they test.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _own_throttle_counters(settings):
    """Throttle counters live in the cache: every test counts in its own key namespace (never a flush:
    the cache may be a Redis shared with other suites)."""
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["KEY_PREFIX"] = f"{caches['default'].get('KEY_PREFIX', '')}:{uuid.uuid4().hex}"
    settings.CACHES = caches


@pytest.fixture
def team(db):
    """One project with an owner, a member, a viewer; a stranger owning another project."""
    owner = UserFactory(username="owner")
    project = project_create(name="alpha", user=owner)
    member = MembershipFactory(project=project, role=Role.MEMBER, user=UserFactory(username="member")).user
    viewer = MembershipFactory(project=project, role=Role.VIEWER, user=UserFactory(username="viewer")).user
    stranger = UserFactory(username="stranger")
    other = project_create(name="beta", user=stranger)
    return {
        "project": project,
        "owner": owner,
        "member": member,
        "viewer": viewer,
        "stranger": stranger,
        "other_project": other,
    }


@pytest.fixture
def experiment(team):
    return ExperimentFactory(project=team["project"], created_by=team["member"])


def client_for(user=None, *, token: str | None = None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    elif user is not None:
        client.force_authenticate(user)
    return client


@pytest.fixture
def token_client():
    """An API client authenticated by a real user token (the scripts' path)."""

    def make(user, **kwargs) -> APIClient:
        return client_for(token=token_create(user=user, name="tests", **kwargs).secret)

    return make


class BusListener:
    """Listens to a run on the live bus (as a web process's hub does, on an event loop of its own in a
    thread) and collects what is published to it."""

    def __init__(self, run_id: int):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.waiting: list[Envelope] = []
        self.reader = self._run(self._open(run_id))

    def _run(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _open(self, run_id: int) -> Any:
        reader = live_bus().reader()
        await reader.reopen({run_id})
        return reader

    async def _next(self) -> Envelope:
        if not self.waiting:
            self.waiting = await self.reader.receive()
        return self.waiting.pop(0)

    def receive(self, timeout: float = 2.0) -> Envelope:
        return self._run(asyncio.wait_for(self._next(), timeout), timeout + 1)

    def receive_payload(self, timeout: float = 2.0) -> dict[str, Any]:
        """The next envelope's payload, as a browser reads it."""
        return json.loads(self.receive(timeout).text)

    def close(self) -> None:
        self._run(self.reader.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def listen():
    listeners: list[BusListener] = []

    def make(run_id: int) -> BusListener:
        listener = BusListener(run_id)
        listeners.append(listener)
        return listener

    yield make
    for listener in listeners:
        listener.close()

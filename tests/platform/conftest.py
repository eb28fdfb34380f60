"""Fixtures of the platform tests: users in each role of one project, API clients, a live-group listener."""

from __future__ import annotations

import copy
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from rest_framework.test import APIClient

from accounts.models import Role
from accounts.services import project_create, token_create
from tests.factories import ExperimentFactory, MembershipFactory, UserFactory


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


class GroupListener:
    """Joins a run's channel-layer group and collects what is published to it."""

    def __init__(self, group: str):
        self.layer = get_channel_layer()
        self.group = group
        self.channel = async_to_sync(self.layer.new_channel)()
        async_to_sync(self.layer.group_add)(group, self.channel)

    def receive(self, timeout: float = 2.0) -> dict:
        import asyncio

        async def _recv():
            return await asyncio.wait_for(self.layer.receive(self.channel), timeout)

        return async_to_sync(_recv)()

    def close(self) -> None:
        async_to_sync(self.layer.group_discard)(self.group, self.channel)


@pytest.fixture
def listen():
    listeners: list[GroupListener] = []

    def make(run_id: int) -> GroupListener:
        listener = GroupListener(f"run_{run_id}")
        listeners.append(listener)
        return listener

    yield make
    for listener in listeners:
        listener.close()

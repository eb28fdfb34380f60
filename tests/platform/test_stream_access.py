"""The live stream's repeated access check (tracking/stream_access.py): after a passed check, the next
ones read the session, the user and the membership in one statement; any change to them falls back to
Django's check, which decides. Real database."""

from __future__ import annotations

import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.models import Membership, Role
from tests.factories import MembershipFactory
from tests.frontend.test_consumers import session_cookie
from tests.platform.test_live_membership import world  # noqa: F401  (fixture)
from tracking import consumers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("by_token", [False, True])
def test_a_repeated_check_is_one_statement_until_a_row_it_read_changes(world, by_token):  # noqa: F811
    """After a passed check, the next ones read the session, the user and the membership in one
    statement; a change to any of them falls back to Django's check, which decides: a session that
    changed but still logs in passes (and is recorded again), a removed member does not."""
    session = SessionStore(world["cookie"].decode().split("=", 1)[1])
    scope = {"user": world["viewer"], "session": None if by_token else session}
    if by_token:
        scope["auth"] = object()
    stream = SimpleNamespace(scope=scope, run_id=world["run"].pk, grant=None)

    def checked() -> tuple[bool, int]:
        with CaptureQueriesContext(connection) as queries:
            ok = consumers._access(stream)
        return ok, len(queries)

    ok, first = checked()
    assert ok and stream.grant is not None and first > 1
    assert checked() == (True, 1)
    if not by_token:
        session["note"] = "changed"  # the session's data changes; it still logs the user in
        session.save()
        ok, n = checked()
        assert ok and n > 1
        assert checked() == (True, 1)
    Membership.objects.filter(user=world["viewer"], project=world["run"].project).delete()
    ok, n = checked()
    assert not ok and n > 1 and stream.grant is None


# --- the cached verdict against Django's own, after any change to the rows ---------------------------------

OPS = ("expire", "renew", "touch", "logout", "password", "deactivate", "activate", "remove", "add")


def _apply(op: str, world: dict, session: SessionStore) -> None:  # noqa: F811
    """One change to a row the check reads (``renew``, ``activate`` and ``add`` undo one)."""
    viewer, project = world["viewer"], world["run"].project
    users = type(viewer).objects.filter(pk=viewer.pk)
    sessions = Session.objects.filter(session_key=session.session_key)
    members = Membership.objects.filter(user=viewer, project=project)
    if op == "expire":  # the session's expiry passes; its data stays as it was
        sessions.update(expire_date=timezone.now() - timedelta(seconds=1))
    elif op == "renew":
        sessions.update(expire_date=timezone.now() + timedelta(days=1))
    elif op == "touch" and sessions.exists():  # the data changes; the session may still log the user in
        session["note"] = uuid.uuid4().hex
        session.save()
    elif op == "logout":
        sessions.delete()
    elif op == "password":
        user = users.get()
        user.set_password(uuid.uuid4().hex)
        user.save()
    elif op in ("deactivate", "activate"):
        users.update(is_active=op == "activate")
    elif op == "remove":
        members.delete()
    elif op == "add" and not members.exists():
        MembershipFactory(project=project, role=Role.VIEWER, user=viewer)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(by_token=st.booleans(), ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=6))
def test_the_cached_verdict_is_djangos_after_any_changes_to_the_rows(world, by_token, ops):  # noqa: F811
    """Whatever happens to the session (expired, renewed, changed, logged out), the password, the user's
    ``is_active`` and the membership, in any order, each repeated check of an open stream answers what
    Django's check answers for the same rows with nothing recorded (a fresh stream's check)."""
    viewer = world["viewer"]
    type(viewer).objects.filter(pk=viewer.pk).update(is_active=True)
    _apply("add", world, SessionStore())
    user = type(viewer).objects.get(pk=viewer.pk)  # the handshake's user, kept by the open stream
    session = SessionStore(session_cookie(user).decode().split("=", 1)[1])
    scope = {"user": user, "session": None if by_token else session}
    if by_token:
        scope["auth"] = object()
    stream = SimpleNamespace(scope=scope, run_id=world["run"].pk, grant=None)
    assert consumers._access(stream) and stream.grant is not None
    for op in ops:
        _apply(op, world, session)
        fresh = SimpleNamespace(scope=scope, run_id=world["run"].pk, grant=None)
        assert consumers._access(stream) == consumers._access(fresh), (op, ops)

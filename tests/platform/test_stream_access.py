"""The live stream's repeated access check (tracking/stream_access.py): after a passed check, the next
ones read the session, the user and the membership in one statement; any change to them falls back to
Django's check, which decides. Real database."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import Membership
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

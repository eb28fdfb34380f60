"""May this user still follow this run? The check a live stream repeats every few seconds.

Django's own check (the session still logs the user in: ``get_user`` on a freshly loaded session; the user
is an active member of the run's project) costs three ORM queries and ~3 ms of web CPU. A process with
100 open streams repeats it 20 times a second, which was a tenth of the web process's CPU under a sweep's
load (docs/benchmarks.md). Its verdict depends only on rows: the session's data and expiry, the user's
password hash and ``is_active``, the membership, the run's project (and settings, fixed for a process).
So a passed check records the two rows it cannot see otherwise (``Grant``: the session's data, the
password hash), read before and after it and equal both times; the next checks read those rows and the
membership in one statement (``still_granted``), and only when anything differs is Django's check made
again. A session logged out (its row deleted), expired, or changed, a password changed (a new salted
hash), a deactivated user or a removed membership all differ, and get Django's verdict.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user, get_user_model
from django.contrib.sessions.models import Session
from django.db import connection
from django.utils import timezone

from accounts.models import Membership
from experiments.models import Run

DB_SESSIONS = "django.contrib.sessions.backends.db"


@dataclass(frozen=True)
class Grant:
    """The rows a passed check depended on: ``session_data`` (None for a token stream, which has no
    session) and the user's ``password`` hash."""

    session_data: str | None
    password: str


def _session_still_logs_in(user: Any, session: Any) -> bool:
    """The browser session the stream was opened with still logs in ``user``: it was not logged out (the
    session is gone from the store) and the password did not change since (Django's session auth hash
    no longer matches). Read fresh from the session store, the way Django authenticates a request."""
    key = getattr(session, "session_key", None)
    if not key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(key)
    fresh = get_user(SimpleNamespace(session=store))
    return bool(fresh.is_authenticated and fresh.pk == user.pk)


def run_for_member(user: Any, run_id: int, session: Any = None, *, by_token: bool = False) -> Run | None:
    """Django's check: the run if ``user`` belongs to its project and ``session`` still logs them in,
    else None (unknown run and foreign run look alike). A stream opened with an API token (``by_token``)
    has no session: its token is re-checked by ``tracking/ws_auth.py`` instead."""
    if not getattr(user, "is_authenticated", False):
        return None
    if not by_token and not _session_still_logs_in(user, session):
        return None
    # The user row is re-read too: a deactivated user is gone as much as a removed member.
    return Run.objects.filter(
        pk=run_id, project__memberships__user=user, project__memberships__user__is_active=True
    ).first()


@functools.cache
def _grant_sql() -> str:
    users, sessions = get_user_model()._meta.db_table, Session._meta.db_table
    runs, members = Run._meta.db_table, Membership._meta.db_table
    return (
        f"SELECT u.password, (SELECT s.session_data FROM {sessions} s WHERE s.session_key = %s "
        f"AND s.expire_date > %s) FROM {users} u WHERE u.id = %s AND u.is_active AND EXISTS "
        f"(SELECT 1 FROM {runs} r JOIN {members} m ON m.project_id = r.project_id "
        f"WHERE r.id = %s AND m.user_id = u.id)"
    )


def _rows(user_id: int, run_id: int, session_key: str | None) -> Grant | None:
    """The rows a grant records, when ``user_id`` is an active member of the run's project; one statement."""
    with connection.cursor() as cur:
        cur.execute(_grant_sql(), [session_key or "", timezone.now(), user_id, run_id])
        row = cur.fetchone()
    if row is None:
        return None
    return Grant(session_data=row[1] if session_key else None, password=row[0])


def check(user: Any, run_id: int, session: Any, *, by_token: bool) -> tuple[bool, Grant | None]:
    """Django's check, and the rows to skip it next time when they were the same before and after it (a
    session store other than the database's is always checked Django's way)."""
    if not getattr(user, "is_authenticated", False):
        return False, None
    key = None if by_token else getattr(session, "session_key", None)
    recordable = by_token or (key is not None and settings.SESSION_ENGINE == DB_SESSIONS)
    before = _rows(user.pk, run_id, key) if recordable else None
    if run_for_member(user, run_id, session, by_token=by_token) is None:
        return False, None
    after = _rows(user.pk, run_id, key) if before is not None else None
    if after is None or after != before or (key is not None and after.session_data is None):
        return True, None
    return True, after


def still_granted(grant: Grant, user: Any, run_id: int, session: Any, *, by_token: bool) -> bool:
    """The rows ``grant`` recorded are unchanged and the membership holds: the check would pass again."""
    key = None if by_token else getattr(session, "session_key", None)
    return _rows(user.pk, run_id, key) == grant

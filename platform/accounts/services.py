"""Writes of the accounts app: projects, memberships, API tokens."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from accounts.models import ApiToken, Invitation, Membership, Project, Role, TokenKind

if TYPE_CHECKING:
    from experiments.models import Run

TOKEN_PREFIX = "rlp_"


class PermissionProblem(Exception):
    """A business rule forbids this change (e.g. removing a project's last owner)."""


class TokenRuleError(Exception):
    """A token created with a token would be broader or longer-lived than it (``field`` says where)."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str  # the only time the secret exists in clear text


def _new_secret() -> tuple[str, str]:
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return secret, secret[: len(TOKEN_PREFIX) + 8]


def project_create(*, name: str, description: str = "", user: AbstractBaseUser) -> Project:
    """A new project; its creator becomes its owner."""
    with transaction.atomic():
        project = Project.objects.create(name=name, description=description, created_by=user)
        Membership.objects.create(project=project, user=user, role=Role.OWNER)
    return project


def membership_set(*, project: Project, user: AbstractBaseUser, role: str) -> Membership:
    """Add ``user`` to ``project`` or change their role. Refuses to demote the last owner."""
    if role not in Role.values:
        raise ValueError(f"unknown role {role!r}")
    with transaction.atomic():
        membership, created = Membership.objects.select_for_update().get_or_create(
            project=project, user=user, defaults={"role": role}
        )
        if not created and membership.role != role:
            if membership.role == Role.OWNER:
                _ensure_other_owner(project, membership)
            membership.role = role
            membership.save(update_fields=["role"])
    return membership


def member_invite(*, project: Project, username: str, role: str, by: AbstractBaseUser | None) -> Invitation:
    """Offer ``role`` in ``project`` to the account named ``username`` (whether or not it exists); a
    second invitation of the same name replaces the role."""
    if role not in Role.values:
        raise ValueError(f"unknown role {role!r}")
    invitation, _ = Invitation.objects.update_or_create(
        project=project, username=username, defaults={"role": role, "invited_by": by}
    )
    return invitation


def invitation_accept(*, invitation: Invitation, user: AbstractBaseUser) -> Membership:
    """``user`` (the invited account) joins the project with the invited role; the invitation is used up."""
    with transaction.atomic():
        membership = membership_set(project=invitation.project, user=user, role=invitation.role)
        invitation.delete()
    return membership


def membership_remove(*, membership: Membership) -> None:
    with transaction.atomic():
        if membership.role == Role.OWNER:
            _ensure_other_owner(membership.project, membership)
        membership.delete()


def _ensure_other_owner(project: Project, membership: Membership) -> None:
    others = (
        Membership.objects.select_for_update()
        .filter(project=project, role=Role.OWNER)
        .exclude(pk=membership.pk)
    )
    if not others.exists():
        raise PermissionProblem("a project needs at least one owner: make someone else owner first")


def _bounded_by_parent(
    parent: ApiToken, project: Project | None, expires_at: datetime | None
) -> tuple[Project | None, datetime | None]:
    """(project, expiry) of a token created with ``parent``: its scope and lifetime unless narrower."""
    if parent.project_id is not None:
        if project is None:
            project = parent.project
        elif project.pk != parent.project_id:
            raise TokenRuleError(
                "project",
                f"a token limited to project {parent.project_id} can only create tokens limited to it",
            )
    if parent.expires_at is not None:
        if expires_at is None:
            expires_at = parent.expires_at
        elif expires_at > parent.expires_at:
            raise TokenRuleError(
                "expires_at",
                f"must not be later than the expiry of the token used ({parent.expires_at.isoformat()})",
            )
    return project, expires_at


def token_create(
    *,
    user: AbstractBaseUser,
    name: str,
    project: Project | None = None,
    expires_at: datetime | None = None,
    parent: ApiToken | None = None,
) -> IssuedToken:
    """A user token (all the user's projects, or only ``project``). The secret is returned once.

    ``parent``: the token the request was authenticated with. The new token is then no broader (same
    project limit) and lives no longer than it, and is revoked with it; TokenRuleError otherwise.
    """
    if parent is not None:
        if parent.kind != TokenKind.USER or parent.user_id != user.pk:
            raise TokenRuleError("token", "only a user token can create tokens, for its own user")
        if not parent.can_create_tokens:
            raise TokenRuleError(
                "token",
                "a token issued by a password login (rlp login) cannot create tokens: create one under "
                "/tokens/ in a browser session",
            )
        project, expires_at = _bounded_by_parent(parent, project, expires_at)
    secret, prefix = _new_secret()
    token = ApiToken.objects.create(
        kind=TokenKind.USER,
        name=name,
        user=user,
        project=project,
        parent=parent,
        prefix=prefix,
        key_hash=hash_secret(secret),
        expires_at=expires_at,
    )
    return IssuedToken(token=token, secret=secret)


def login_token_lifetime() -> timedelta:
    """How long a token issued for a username and password lives at most (``LOGIN_TOKEN_LIFETIME_DAYS``)."""
    return timedelta(days=int(getattr(settings, "LOGIN_TOKEN_LIFETIME_DAYS", 30)))


def login_token_create(*, user: AbstractBaseUser, name: str, expires_at: datetime | None) -> IssuedToken:
    """The token of a password login (``POST /api/tokens/login``): it expires (at the latest after
    ``login_token_lifetime``, sooner when asked) and creates no tokens."""
    latest = timezone.now() + login_token_lifetime()
    issued = token_create(user=user, name=name, expires_at=min(expires_at or latest, latest))
    ApiToken.objects.filter(pk=issued.token.pk).update(can_create_tokens=False)
    issued.token.can_create_tokens = False
    return issued


def tokens_revoke_for_password_change(*, user_id: int) -> int:
    """A changed password revokes the user's tokens, as it ends their live streams: whoever held the old
    password may have made them. Returns how many were revoked."""
    return ApiToken.objects.filter(user_id=user_id, kind=TokenKind.USER, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )


def ingest_token_lifetime() -> timedelta:
    """An ingest token lives as long as the reaper lets a silent run live; heartbeats renew it."""
    return timedelta(seconds=int(getattr(settings, "RUN_HEARTBEAT_TIMEOUT_S", 120)))


def ingest_token_issue(*, run: Run, expires_at: datetime | None = None) -> IssuedToken:
    """A token that may only report metrics/events/samples/heartbeats of ``run`` (for the engine).

    Earlier ingest tokens of the run are revoked, so only the latest launch of the run can report.
    It expires after the heartbeat timeout unless the run's heartbeats renew it
    (:func:`ingest_tokens_renew`), and is revoked when the run ends.
    """
    if expires_at is None:
        expires_at = timezone.now() + ingest_token_lifetime()
    secret, prefix = _new_secret()
    with transaction.atomic():
        ApiToken.objects.filter(run=run, kind=TokenKind.INGEST, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        token = ApiToken.objects.create(
            kind=TokenKind.INGEST,
            name=f"ingest run {run.pk}",
            run=run,
            project_id=run.project_id,
            prefix=prefix,
            key_hash=hash_secret(secret),
            expires_at=expires_at,
        )
    return IssuedToken(token=token, secret=secret)


def token_family_ids(token: ApiToken) -> set[int]:
    """Ids of ``token`` and of every token created with it, recursively: what a request authenticated
    by ``token`` may see and revoke of its user's tokens (never its parent, nor a sibling)."""
    ids, frontier = {token.pk}, [token.pk]
    while frontier:  # one query per generation; chains are short
        frontier = [pk for pk in ApiToken.objects.filter(parent_id__in=frontier).values_list("pk", flat=True)
                    if pk not in ids]  # fmt: skip
        ids.update(frontier)
    return ids


def token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke ``token`` and every token created with it (recursively). Idempotent: a revoked token
    keeps its first revocation time."""
    ids = token_family_ids(token)
    ApiToken.objects.filter(pk__in=ids, revoked_at__isnull=True).update(revoked_at=timezone.now())
    token.refresh_from_db()
    return token


def ingest_tokens_renew(*, run_id: int) -> int:
    """Push back the expiry of the run's live ingest tokens by the heartbeat timeout (a heartbeat).
    An expired token stays expired."""
    now = timezone.now()
    return ApiToken.objects.filter(
        run_id=run_id, kind=TokenKind.INGEST, revoked_at__isnull=True, expires_at__gt=now
    ).update(expires_at=now + ingest_token_lifetime())


def ingest_tokens_revoke_for_run(*, run_id: int) -> int:
    return ApiToken.objects.filter(run_id=run_id, kind=TokenKind.INGEST, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )

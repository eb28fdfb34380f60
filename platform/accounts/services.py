"""Writes of the accounts app: projects, memberships, API tokens."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from accounts.models import ApiToken, Membership, Project, Role, TokenKind

if TYPE_CHECKING:
    from experiments.models import Run

TOKEN_PREFIX = "rlp_"


class PermissionProblem(Exception):
    """A business rule forbids this change (e.g. removing a project's last owner)."""


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


def token_create(
    *,
    user: AbstractBaseUser,
    name: str,
    project: Project | None = None,
    expires_at: datetime | None = None,
) -> IssuedToken:
    """A user token (all the user's projects, or only ``project``). The secret is returned once."""
    secret, prefix = _new_secret()
    token = ApiToken.objects.create(
        kind=TokenKind.USER,
        name=name,
        user=user,
        project=project,
        prefix=prefix,
        key_hash=hash_secret(secret),
        expires_at=expires_at,
    )
    return IssuedToken(token=token, secret=secret)


def ingest_token_issue(*, run: Run, expires_at: datetime | None = None) -> IssuedToken:
    """A token that may only report metrics/events/samples/heartbeats of ``run`` (for the engine).

    Earlier ingest tokens of the run are revoked, so only the latest launch of the run can report.
    """
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


def token_revoke(*, token: ApiToken) -> ApiToken:
    """Idempotent: revoking a revoked token keeps its first revocation time."""
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    token.refresh_from_db()
    return token


def ingest_tokens_revoke_for_run(*, run_id: int) -> int:
    return ApiToken.objects.filter(run_id=run_id, kind=TokenKind.INGEST, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )

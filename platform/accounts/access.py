"""Who may see and change what. Used by every API view of the platform.

Policy (documented in docs/api.md):
- Objects live in projects. A user sees a project's objects only if they are a member of it; for anyone
  else those objects do not exist (404), so ids of other projects leak nothing.
- viewer: read. member: also create/change experiments and runs, report metrics. owner: also manage the
  project, its memberships and the tokens scoped to it. A visible object you may not change: 403.
- A user token limited to a project acts only in that project. A run ingest token (anonymous user) is
  accepted only by the ingestion endpoints of its run.
- No credentials: 401.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from django.db.models import QuerySet
from rest_framework import exceptions, permissions
from rest_framework.request import Request

from accounts.models import ROLE_RANK, ApiToken, Membership, Project, Role, TokenKind


def _token_project_id(request: Request) -> int | None:
    auth = getattr(request, "auth", None)
    if isinstance(auth, ApiToken) and auth.kind == TokenKind.USER:
        return auth.project_id
    return None


# {project_id: role} per request, held while the request lives (keyed by the request object itself,
# never an attribute added to DRF's object).
_ROLES: WeakKeyDictionary[Request, dict[int, str]] = WeakKeyDictionary()


def project_roles(request: Request) -> dict[int, str]:
    """{project_id: role} for the requesting user (once per request; :func:`forget_roles` after a change)."""
    cached = _ROLES.get(request)
    if cached is not None:
        return cached
    roles: dict[int, str] = {}
    user = request.user
    if user is not None and user.is_authenticated:
        qs = Membership.objects.filter(user=user)
        limit = _token_project_id(request)
        if limit is not None:
            qs = qs.filter(project_id=limit)
        roles = dict(qs.values_list("project_id", "role"))
    _ROLES[request] = roles
    return roles


def forget_roles(request: Request) -> None:
    """The requesting user's memberships changed during the request (a project created)."""
    _ROLES.pop(request, None)


def visible_project_ids(request: Request) -> list[int]:
    return list(project_roles(request))


def visible_projects(request: Request) -> QuerySet[Project]:
    return Project.objects.filter(pk__in=visible_project_ids(request))


def has_role(request: Request, project_id: int, minimum: str) -> bool:
    role = project_roles(request).get(project_id)
    return role is not None and ROLE_RANK[role] >= ROLE_RANK[minimum]


def require_role(request: Request, project_id: int, minimum: str) -> None:
    """404 if the project is not visible to the user, 403 if their role is below ``minimum``."""
    role = project_roles(request).get(project_id)
    if role is None:
        raise exceptions.NotFound("Not found.")
    if ROLE_RANK[role] < ROLE_RANK[minimum]:
        raise exceptions.PermissionDenied(f"This needs the {minimum} role in the project; you are {role}.")


def ingest_token_run_id(request: Request) -> int | None:
    auth = getattr(request, "auth", None)
    if isinstance(auth, ApiToken) and auth.kind == TokenKind.INGEST:
        return auth.run_id
    return None


class IngestOrMember(permissions.BasePermission):
    """Authenticated users (role checked by the view), or a run ingest token (run checked by the view)."""

    def has_permission(self, request: Request, view) -> bool:
        return (
            bool(request.user and request.user.is_authenticated) or ingest_token_run_id(request) is not None
        )


def require_ingest(request: Request, run_id: int, project_id: int) -> None:
    """Reporting into a run: its own ingest token, or a member (or owner) of its project."""
    token_run = ingest_token_run_id(request)
    if token_run is not None:
        if token_run != run_id:
            raise exceptions.NotFound("Not found.")
        return
    require_role(request, project_id, Role.MEMBER)


class Conflict(exceptions.APIException):
    """The object is in a state that does not allow this (e.g. cancelling a finished run)."""

    status_code = 409
    default_detail = "Conflict with the current state."
    default_code = "conflict"

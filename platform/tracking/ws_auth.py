"""API-token authentication of the run websocket (``ws/runs/<id>/``), for scripts and the ``rlp`` client.

A handshake with an ``Authorization: Token <secret>`` header (``Bearer`` too) is authenticated by the
token instead of the session cookie, with the same rules as the REST API: a user token acts as its user
(so the consumer's membership rule and its re-checks apply unchanged), a token limited to a project
sees only that project's runs, and an ingest token (it belongs to no user) sees no stream.

Scripts want a reason, not a bare HTTP 403, so a token connection that is refused is accepted and closed
at once with a code: **4401** when the token is unknown, revoked or expired (or its user inactive),
**4403** when it may not see the run (not a member, another project, an ingest token). The consumer's
own refusal (it closes before accepting: a browser gets HTTP 403 as before) becomes the same accept +
close 4403 for a token connection. While the stream is open the token is checked again, at most every
``TOKEN_RECHECK_S``, whenever the server sends something: a token revoked meanwhile closes it with 4401.
Handshakes without the header are left to the session middleware, unchanged.
"""

from __future__ import annotations

import time
from typing import Any

from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser

from accounts.authentication import KEYWORDS
from accounts.ids import parse_db_id
from accounts.models import ApiToken, TokenKind
from accounts.services import hash_secret
from experiments.models import Run

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
TOKEN_RECHECK_S = 5.0

Scope = dict[str, Any]


def authorization_secret(scope: Scope) -> str | None:
    """The secret of an ``Authorization: Token|Bearer <secret>`` header; ``""`` when the header is
    there but malformed; None when there is none (or it names another scheme)."""
    raw = next((v for k, v in scope.get("headers") or () if k.lower() == b"authorization"), None)
    if raw is None:
        return None
    parts = raw.split()
    if not parts or parts[0].lower().decode(errors="replace") not in KEYWORDS:
        return None
    if len(parts) != 2:
        return ""
    try:
        return parts[1].decode("ascii")
    except UnicodeDecodeError:
        return ""


def _usable_token(secret: str) -> ApiToken | None:
    """The token if it authenticates (known, active, its user active), else None."""
    token = (
        ApiToken.objects.select_related("user").filter(key_hash=hash_secret(secret)).first()
        if secret
        else None
    )
    if token is None or not token.is_active:
        return None
    if token.kind == TokenKind.USER and (token.user is None or not token.user.is_active):
        return None
    return token


def _admit(secret: str, run_id: int | None) -> tuple[ApiToken | None, int | None]:
    """(token, None) when it may open the stream of ``run_id``, else (None, close code)."""
    token = _usable_token(secret)
    if token is None:
        return None, CLOSE_UNAUTHENTICATED
    if token.kind != TokenKind.USER:
        return None, CLOSE_FORBIDDEN  # an ingest token reports to its run; it reads nothing
    if (
        token.project_id is not None
        and not Run.objects.filter(pk=run_id, project_id=token.project_id).exists()
    ):
        return None, CLOSE_FORBIDDEN
    return token, None


def _still_usable(token_id: int) -> bool:
    token = ApiToken.objects.select_related("user").filter(pk=token_id).first()
    return token is not None and token.is_active and token.user is not None and token.user.is_active


admit = database_sync_to_async(_admit)
still_usable = database_sync_to_async(_still_usable)


async def refuse(receive: Any, send: Any, code: int) -> None:
    """Complete the handshake and close it with ``code`` (a client sees the code, not a bare 403)."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": code})


class TokenAuthMiddleware:
    """Wraps the run consumer's route (``scope["url_route"]`` names the run); see the module docstring."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> Any:
        secret = authorization_secret(scope)
        if scope.get("type") != "websocket" or secret is None:
            return await self.inner(scope, receive, send)
        run_id = parse_db_id((scope.get("url_route") or {}).get("kwargs", {}).get("run_id"))
        token, code = await admit(secret, run_id)  # (no run: a project's token is refused, 4403)
        if token is None:
            return await refuse(receive, send, code or CLOSE_UNAUTHENTICATED)
        scope = dict(scope, user=token.user or AnonymousUser(), auth=token)
        return await self.inner(scope, receive, _TokenSend(send, token.pk))


class _TokenSend:
    """The consumer's ``send`` for a token connection: a refusal before accept becomes accept + 4403, and
    a token revoked while the stream is open closes it with 4401 (then nothing more is sent)."""

    def __init__(self, send: Any, token_id: int) -> None:
        self.send = send
        self.token_id = token_id
        self.accepted = False
        self.closed = False
        self.checked = time.monotonic()

    async def __call__(self, message: dict[str, Any]) -> None:
        if self.closed:
            return
        kind = message.get("type")
        if kind == "websocket.accept":
            self.accepted = True
        elif kind == "websocket.close":
            self.closed = True
            if not self.accepted:
                await self.send({"type": "websocket.accept"})
                message = {"type": "websocket.close", "code": message.get("code") or CLOSE_FORBIDDEN}
        elif self.accepted and time.monotonic() - self.checked >= TOKEN_RECHECK_S:
            self.checked = time.monotonic()
            if not await still_usable(self.token_id):
                self.closed = True
                message = {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}
        await self.send(message)

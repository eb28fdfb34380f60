"""``Authorization: Token <secret>`` for scripts and the engine (``Bearer`` is accepted too).

A user token authenticates as its user. A run ingest token authenticates as *anonymous* with the token
as ``request.auth``: every endpoint that requires a user refuses it, and only the ingestion endpoints of
its own run accept it (see accounts.access.IngestOrMember). Fail closed by construction.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from accounts.models import ApiToken, TokenKind
from accounts.services import hash_secret

KEYWORDS = ("token", "bearer")
LAST_USED_RESOLUTION = timedelta(minutes=1)  # avoid one UPDATE per ingest request
# What ``ingest_token`` reads: the token row's own columns that the checks and the ingestion endpoints
# use, no join (SQL built once per process from the model: the ORM would build it on every request).
_INGEST_FIELDS = ("id", "kind", "run_id", "revoked_at", "expires_at", "last_used_at")
_INGEST_SQL = "SELECT {columns} FROM {table} WHERE {key_hash} = %s".format(
    columns=", ".join(ApiToken._meta.get_field(f).column for f in _INGEST_FIELDS),
    table=ApiToken._meta.db_table,
    key_hash=ApiToken._meta.get_field("key_hash").column,
)


def _secret(request: Request) -> str | None:
    """The secret of an ``Authorization: Token <secret>`` header; None without one (not ours: session
    authentication may try); AuthenticationFailed for a malformed one."""
    header = authentication.get_authorization_header(request).split()
    if not header or header[0].lower().decode(errors="replace") not in KEYWORDS:
        return None
    if len(header) != 2:
        raise exceptions.AuthenticationFailed("Authorization header must be 'Token <secret>'.")
    try:
        return header[1].decode("ascii")
    except UnicodeDecodeError:
        raise exceptions.AuthenticationFailed("Invalid token.") from None


def _checked(token: ApiToken | None) -> ApiToken:
    """``token`` if it may authenticate now (its last use recorded, once a minute at most)."""
    if token is None:
        raise exceptions.AuthenticationFailed("Invalid token.")
    if not token.is_active:
        raise exceptions.AuthenticationFailed("Token revoked or expired.")
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def ingest_token(request) -> ApiToken | None:
    """The run ingest token a request carries, checked as ``TokenAuthentication`` checks it, without its
    run (only ``run_id``) and in one prebuilt query: the metrics ingestion front (tracking/ingest.py).
    None without a token header or for another kind of token; AuthenticationFailed as ``authenticate``."""
    secret = _secret(request)
    if secret is None:
        return None
    found = list(ApiToken.objects.raw(_INGEST_SQL, [hash_secret(secret)]))
    token = _checked(found[0] if found else None)
    return token if token.kind == TokenKind.INGEST else None


class TokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request):
        secret = _secret(request)
        if secret is None:
            return None  # not ours: let session auth try
        try:  # key_hash is unique: get(), not first() (no ORDER BY to build and run on every request)
            token = ApiToken.objects.select_related("user", "run").get(key_hash=hash_secret(secret))
        except ApiToken.DoesNotExist:
            token = None
        token = _checked(token)
        if token.kind == TokenKind.INGEST:
            return AnonymousUser(), token
        if token.user is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return "Token"  # makes unauthenticated requests 401 (with WWW-Authenticate), not 403


class TokenAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "accounts.authentication.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <secret>`: a user token, or a run's ingest token (ingestion endpoints only).",
        }

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


class TokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower().decode(errors="replace") not in KEYWORDS:
            return None  # not ours: let session auth try
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Token <secret>'.")
        try:
            secret = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        try:  # key_hash is unique: get(), not first() (no ORDER BY to build and run on every request)
            token = ApiToken.objects.select_related("user", "run").get(key_hash=hash_secret(secret))
        except ApiToken.DoesNotExist:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        if not token.is_active:
            raise exceptions.AuthenticationFailed("Token revoked or expired.")
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
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

"""Rate limits (DRF throttles) on login, token creation, ingestion and heartbeats: 429 with ``Retry-After``
beyond them.

Rates are ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (settings ``THROTTLE_*``), read on every request.
Counting is a fixed window per key in the cache (one atomic increment, one round trip to Redis: O(1) per
request, unlike DRF's default sliding log, which stores one timestamp per request and would cost a large
cache value on every ingestion call at the ingest rate). A window allows at most ``n`` requests; up to ``2n`` can pass around
a window boundary, which is fine for abuse limits.
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from collections.abc import Mapping
from typing import Any

import redis
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache import cache as default_cache
from django.core.cache.backends.redis import RedisCache
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from accounts.access import ingest_token_run_id

_redis_clients: dict[str, Any] = {}


def count_in_window(cache: Any, key: str, ttl_s: int) -> int:
    """Count one more request under ``key`` (created with a ``ttl_s`` expiry) and return the count. On
    Redis one round trip (SET NX EX and INCR, pipelined; every ingestion request pays it); elsewhere the
    cache API's add and incr. ``cache`` may be ``django.core.cache.cache`` (what DRF's throttles hold): a
    proxy to the default backend, unwrapped here (an isinstance check on the proxy itself never matched,
    and every request paid add and incr on a Redis connection opened for it)."""
    if cache is default_cache:
        cache = caches[DEFAULT_CACHE_ALIAS]
    if isinstance(cache, RedisCache):
        location = cache._servers[0]
        client = _redis_clients.get(location)
        if client is None:  # one thread-safe client (and connection pool) per process and server
            client = _redis_clients.setdefault(location, redis.Redis.from_url(location))
        full = cache.make_and_validate_key(key)
        pipe = client.pipeline(transaction=False)
        pipe.set(full, 0, ex=ttl_s, nx=True)
        pipe.incr(full)
        return int(pipe.execute()[1])
    cache.add(key, 0, ttl_s)
    try:
        return cache.incr(key)
    except ValueError:  # the entry expired between add and incr
        cache.set(key, 1, ttl_s)
        return 1


class FixedWindowThrottle(SimpleRateThrottle):
    """SimpleRateThrottle with an O(1) counter per (key, window)."""

    def get_rate(self) -> str | None:
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)  # read per request: settings may change

    def allow_request(self, request, view) -> bool:
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        return self._count_key()

    def _count_key(self) -> bool:
        now = self.timer()
        window = math.floor(now / self.duration)
        count = count_in_window(self.cache, f"{self.key}:{window}", self.duration + 1)
        self._wait = (window + 1) * self.duration - now
        return count <= self.num_requests

    def wait(self) -> float:
        return max(self._wait, 1.0)


class TokenCreateThrottle(FixedWindowThrottle):
    """``POST /api/tokens``, per user."""

    scope = "token_create"

    def get_cache_key(self, request, view) -> str | None:
        if request.method != "POST" or not request.user.is_authenticated:
            return None
        return self.cache_format % {"scope": self.scope, "ident": f"user{request.user.pk}"}


class IngestThrottle(FixedWindowThrottle):
    """Ingestion endpoints, per ingest token (one run's engine) or per user."""

    scope = "ingest"

    def get_cache_key(self, request, view) -> str | None:
        if request.method != "POST":
            return None
        if ingest_token_run_id(request) is not None:
            ident = f"token{request.auth.pk}"
        elif request.user.is_authenticated:
            ident = f"user{request.user.pk}"
        else:
            return None
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def allow_ingest_token(self, token_pk: int) -> bool:
        """``allow_request`` for a POST authenticated by the ingest token ``token_pk``: the same key and
        window (the metrics ingestion front, tracking/ingest.py, checks it without a DRF request)."""
        if self.rate is None:
            return True
        self.key = self.cache_format % {"scope": self.scope, "ident": f"token{token_pk}"}
        return self._count_key()


class HeartbeatThrottle(IngestThrottle):
    """``POST /api/runs/{id}/heartbeat``, per ingest token or user, in a bucket of its own: heartbeats
    renew the ingest token, so a data backlog throttled at the ingest rate must never starve them (the
    token would expire with the run still working)."""

    scope = "heartbeat"


class LoginAddressThrottle(FixedWindowThrottle):
    """Login attempts (POSTs) per client address: caps password spraying over many usernames."""

    scope = "login_address"

    def get_cache_key(self, request, view) -> str | None:
        if request.method != "POST":
            return None
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class LoginThrottle(LoginAddressThrottle):
    """Login attempts per client address and username: caps guessing one account's password."""

    scope = "login"

    def get_cache_key(self, request, view) -> str | None:
        if request.method != "POST":
            return None
        username = login_name(attempted_username(request))
        digest = hashlib.sha256(username.encode("utf-8", "surrogatepass")).hexdigest()[:24]
        return self.cache_format % {"scope": self.scope, "ident": f"{self.get_ident(request)}:{digest}"}


def attempted_username(request) -> str:
    """The username a login attempt names: a form field of the login pages, or a field of an API
    request's body (``POST /api/tokens/login``, JSON: ``request.POST`` holds only form bodies)."""
    data = request.data if isinstance(request, Request) else request.POST
    value = data.get("username", "") if isinstance(data, Mapping) else ""
    return value if isinstance(value, str) else ""


def login_name(raw: str) -> str:
    """The account a login attempt is counted against: the name as authentication reads it (NFKC, as
    Django normalises usernames: full-width ``alice`` is ``alice``), lower-cased."""
    return unicodedata.normalize("NFKC", raw[:1000])[:150].lower()


def login_wait_s(request) -> int | None:
    """Seconds the client must wait before another login attempt, or None when it may try now.
    Counts this attempt (a refused attempt counts too: hammering does not shorten the wait)."""
    waits = []
    for throttle in (LoginAddressThrottle(), LoginThrottle()):
        if not throttle.allow_request(request, None):
            waits.append(throttle.wait())
    return math.ceil(max(waits)) if waits else None

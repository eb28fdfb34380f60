"""Rate limits (DRF throttles) on login, token creation, ingestion and heartbeats, and per project on the
alert and webhook actions that queue work: 429 with ``Retry-After`` beyond them.

Rates are ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (settings ``THROTTLE_*``), read on every request.
Counting is a fixed window per key in the cache (one atomic increment, one round trip to Redis: O(1) per
request, unlike DRF's default sliding log, which stores one timestamp per request and would cost a large
cache value on every ingestion call at the ingest rate). A window allows at most ``n`` requests; up to ``2n`` can pass around
a window boundary, which is fine for abuse limits.

The store away (Redis down or unreachable): a throttle never turns that into a 500. Ingestion and
heartbeats let the request through (their ingest token binds them to one run; refusing them would only
make every engine spool and retry); login and token creation, where an unbounded rate is the risk,
answer 503 with ``Retry-After`` (``StoreUnavailable``) until the store is back.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
import unicodedata
from collections.abc import Mapping
from typing import Any

import redis
from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache import cache as default_cache
from django.core.cache.backends.redis import RedisCache
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from accounts.access import ingest_token_run_id

log = logging.getLogger(__name__)

_redis_clients: dict[str, Any] = {}
# A counter is one small round trip: a store that does not answer within these is away (a black-holed
# Redis must not hold every request for the operating system's TCP timeout).
STORE_CONNECT_TIMEOUT_S = 2.0
STORE_TIMEOUT_S = 2.0
STORE_RETRY_AFTER_S = 5  # what a refused request is told while the store is away
# What a store that is away raises: redis-py's errors, and the socket errors of the cache backends.
STORE_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
_LOG_EVERY_S = 30.0
_last_logged = [0.0]


class StoreUnavailable(exceptions.APIException):
    """The rate-limit store is away and this throttle fails closed: 503 with ``Retry-After``."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The rate-limit store is unavailable: try again shortly."
    default_code = "throttle_store_unavailable"

    def __init__(self, wait: int = STORE_RETRY_AFTER_S) -> None:
        super().__init__()
        self.wait = wait  # DRF's exception handler turns it into Retry-After


def _log_store_away(scope: str, exc: BaseException) -> None:
    """One warning per _LOG_EVERY_S: during an outage every request would log one."""
    now = time.monotonic()
    if now - _last_logged[0] >= _LOG_EVERY_S:
        _last_logged[0] = now
        log.warning("rate-limit store unavailable (%s: %s); scope %s", type(exc).__name__, exc, scope)


def _default_redis_location(cache: Any) -> str | None:
    """The first server of the default cache when that cache is Redis, read from the settings as Django
    reads it (a list, or a string split at commas and semicolons); None for any other cache."""
    if cache is not caches[DEFAULT_CACHE_ALIAS] or not isinstance(cache, RedisCache):
        return None
    location = settings.CACHES[DEFAULT_CACHE_ALIAS]["LOCATION"]
    servers = re.split("[;,]", location) if isinstance(location, str) else list(location)
    return servers[0] if servers else None


def count_in_window(cache: Any, key: str, ttl_s: int) -> int:
    """Count one more request under ``key`` (created with a ``ttl_s`` expiry) and return the count. On
    Redis one round trip (SET NX EX and INCR, pipelined; every ingestion request pays it); elsewhere the
    cache API's add and incr. ``cache`` may be ``django.core.cache.cache`` (what DRF's throttles hold): a
    proxy to the default backend, unwrapped here (an isinstance check on the proxy itself never matched,
    and every request paid add and incr on a Redis connection opened for it)."""
    if cache is default_cache:
        cache = caches[DEFAULT_CACHE_ALIAS]
    location = _default_redis_location(cache)
    if location is not None:
        client = _redis_clients.get(location)
        if client is None:  # one thread-safe client (and connection pool) per process and server
            client = _redis_clients.setdefault(
                location,
                redis.Redis.from_url(
                    location,
                    socket_connect_timeout=STORE_CONNECT_TIMEOUT_S,
                    socket_timeout=STORE_TIMEOUT_S,
                ),
            )
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
    """SimpleRateThrottle with an O(1) counter per (key, window). With the store away, ``fail_open``
    lets the request through; otherwise it is refused with StoreUnavailable (503)."""

    fail_open = False

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
        self._wait = (window + 1) * self.duration - now
        try:
            count = count_in_window(self.cache, f"{self.key}:{window}", self.duration + 1)
        except STORE_ERRORS as exc:
            _log_store_away(self.scope, exc)
            if self.fail_open:
                return True
            raise StoreUnavailable() from None
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
    """Ingestion endpoints, per ingest token (one run's engine) or per user; let through while the store
    is away (what it stores is bounded per request, and an ingest token binds it to one run)."""

    scope = "ingest"
    fail_open = True

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


class ProjectThrottle(FixedWindowThrottle):
    """What one project's members can make the platform do, per project whoever asks (webhook and rule
    writes, alert resolutions, alert events a member posts: each one queues work for the workers). The
    views check it once they know the project (``check``: 429 with Retry-After beyond the rate). Let
    through while the store is away: the per-project caps and the delivery budget still hold."""

    fail_open = True

    def __init__(self, scope: str) -> None:
        self.scope = scope
        super().__init__()

    def check(self, project_id: int) -> None:
        if self.rate is None:
            return
        self.key = self.cache_format % {"scope": self.scope, "ident": f"project{project_id}"}
        if not self._count_key():
            raise exceptions.Throttled(wait=math.ceil(self.wait()))


def project_throttle(scope: str, project_id: int) -> None:
    """Count one action of ``scope`` for the project; raise Throttled (429) beyond its rate."""
    ProjectThrottle(scope).check(project_id)


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
    Counts this attempt (a refused attempt counts too: hammering does not shorten the wait). Raises
    StoreUnavailable while the counters' store is away (login fails closed)."""
    waits = []
    for throttle in (LoginAddressThrottle(), LoginThrottle()):
        if not throttle.allow_request(request, None):
            waits.append(throttle.wait())
    return math.ceil(max(waits)) if waits else None

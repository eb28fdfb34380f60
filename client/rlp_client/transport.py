"""HTTP transport: the token header, JSON in and out, errors as exceptions, pagination, and retries.

Retries: an idempotent call (GET, HEAD, PUT, DELETE, OPTIONS) is sent again on a connection error, on
429 and on 503, backing off ``backoff_s`` doubling up to ``backoff_max_s`` (a ``Retry-After`` in seconds
is honoured, capped by ``retry_after_max_s``), at most ``retries`` times. A POST is never sent twice: a
launch or a resume that reached the server before the connection broke must not happen again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from rlp_client.errors import ConnectionFailed, RateLimited, error_for

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently an idempotent call is retried."""

    retries: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    retry_after_max_s: float = 60.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (``attempt`` counts from 0)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.retry_after_max_s)
        base = min(self.backoff_s * (2**attempt), self.backoff_max_s)
        return base * (0.5 + random.random() / 2)  # jitter: many clients do not retry in lockstep


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("Retry-After")
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def _body(response: httpx.Response) -> Any:
    if "json" in response.headers.get("Content-Type", ""):
        try:
            return response.json()
        except ValueError:
            pass
    return response.text


class Transport:
    """One ``httpx.Client`` for a platform at ``base_url`` with a user token."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout_s: float = 30.0,
        retry: RetryPolicy | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.retry = retry or RetryPolicy()
        headers = {"Accept": "application/json", "User-Agent": "rlp-client"}
        if token:
            headers["Authorization"] = f"Token {token}"
        self.http = http or httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send one call (retrying an idempotent one as described above); an error status raises the
        matching :class:`~rlp_client.errors.ApiError`."""
        method = method.upper()
        attempts = self.retry.retries + 1 if method in IDEMPOTENT else 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if last:
                    raise ConnectionFailed(
                        f"{method} {self.base_url}{path}: {exc or type(exc).__name__}"
                    ) from exc
                time.sleep(self.retry.delay(attempt))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                time.sleep(self.retry.delay(attempt, _retry_after(response)))
                continue
            if response.status_code >= 400:
                error = error_for(response.status_code, _body(response))
                if isinstance(error, RateLimited):
                    error.retry_after = _retry_after(response)
                raise error
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return _body(self.request("GET", path, params=_clean(params)))

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return _body(self.request("POST", path, json=body if body is not None else {}))

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        return _body(self.request("PATCH", path, json=body))

    def delete(self, path: str) -> None:
        self.request("DELETE", path)

    def pages(self, path: str, params: dict[str, Any] | None = None, page_size: int = 100) -> Iterator[dict]:
        """Every item of a paginated list (``count``/``next``/``results``), following ``next``."""
        query = _clean(params) | {"limit": page_size, "offset": 0}
        while True:
            page = self.get(path, query)
            if isinstance(page, list):  # an unpaginated list
                yield from page
                return
            results = page.get("results") or []
            yield from results
            if not page.get("next") or not results:
                return
            query["offset"] += len(results)


def _clean(params: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (params or {}).items() if v is not None}

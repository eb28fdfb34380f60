"""The HTTP sink's connection to the platform: POSTs to one run's ingestion endpoints
(``{url}/api/runs/{run_id}/{metrics|events|samples|heartbeat}``) with its ingest token.

Two keep-alive connections (urllib3), one for the data (the sender's one request in flight) and one
for heartbeats, so a slow data request never delays a heartbeat. A connection the server closed while
idle is noticed before it is reused; one that breaks mid-request is tried once more on a new
connection (every POST here is idempotent). A 401 re-reads the token file once (the platform may have
issued a new token) and tries again. An error answer raises what ``http_replies.classify`` makes of
it; no answer at all raises OSError.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3

from rl_engine.sinks.http_replies import AccessRefused, classify

# Told of every request once it is answered or failed: (endpoint, body, the time it was sent, the error
# or None). A benchmark's or a test's window on the traffic; the sink does not need one.
RequestObserver = Callable[[str, dict[str, Any], float, BaseException | None], None]


def read_token_file(path: str | Path) -> str:
    """The ingest token in ``path`` (ASCII ``rlp_…``, surrounding whitespace stripped); a clear
    ValueError when it cannot be read or is empty."""
    try:
        with open(path, encoding="ascii") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the ingest token file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"the ingest token file {path} does not hold an ASCII token") from None
    if not token:
        raise ValueError(f"the ingest token file {path} is empty")
    return token


def _connection_pool(url: str, timeout_s: float) -> urllib3.HTTPConnectionPool:
    """One keep-alive connection to ``url``'s host: a second request waits for it, never opens another."""
    timeout = urllib3.Timeout(total=timeout_s)
    return urllib3.connection_from_url(url, maxsize=1, block=True, timeout=timeout, retries=False)


class IngestClient:
    """Posts to run ``run_id``'s ingestion endpoints on the platform at ``url`` with ``token`` (re-read
    from ``token_file`` after a 401)."""

    def __init__(
        self,
        url: str,
        token: str,
        run_id: int | str,
        *,
        token_file: Path | None = None,
        request_timeout_s: float = 10.0,
        observer: RequestObserver | None = None,
    ) -> None:
        self.base = f"{url.rstrip('/')}/api/runs/{run_id}"
        self._path = f"{urllib3.util.parse_url(url).path or ''}".rstrip("/") + f"/api/runs/{run_id}"
        self._data_pool = _connection_pool(url, request_timeout_s)
        self._heartbeat_pool = _connection_pool(url, request_timeout_s)
        self._token = token
        self._token_file = token_file
        self._token_lock = threading.Lock()
        self._observer = observer
        self.throttled_responses = 0  # 429 answers seen (data and heartbeats)

    def post(self, endpoint: str, body: dict[str, Any], *, heartbeat: bool = False) -> bytes:
        """POST ``body`` to ``endpoint`` on the data connection (the heartbeat one with ``heartbeat``)."""
        pool = self._heartbeat_pool if heartbeat else self._data_pool
        token = self._token
        try:
            return self._post_once(pool, endpoint, body, token)
        except AccessRefused as exc:
            if exc.status != 401 or not self._token_renewed(token):
                raise
        return self._post_once(pool, endpoint, body, self._token)

    def close(self) -> None:
        self._data_pool.close()
        self._heartbeat_pool.close()

    def _post_once(
        self, pool: urllib3.HTTPConnectionPool, endpoint: str, body: dict[str, Any], token: str
    ) -> bytes:
        sent_at = time.time()
        try:
            answer = self._request(pool, endpoint, body, token)
        except BaseException as exc:
            if self._observer is not None:
                self._observer(endpoint, body, sent_at, exc)
            raise
        if self._observer is not None:
            self._observer(endpoint, body, sent_at, None)
        return answer

    def _request(
        self, pool: urllib3.HTTPConnectionPool, endpoint: str, body: dict[str, Any], token: str
    ) -> bytes:
        headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        data = json.dumps(body).encode()
        for attempt in (1, 2):
            try:
                resp = pool.urlopen("POST", f"{self._path}/{endpoint}", body=data, headers=headers)
                break
            except urllib3.exceptions.ProtocolError as exc:
                # The connection broke under the request: most often a keep-alive connection the server
                # closed just as it was reused. Once more on a new one (every POST here is idempotent).
                if attempt == 2:
                    raise OSError(f"{endpoint}: {exc}") from exc
            except urllib3.exceptions.HTTPError as exc:  # no answer (refused, timed out)
                raise OSError(f"{endpoint}: {exc}") from exc
        if resp.status < 300:
            return resp.data
        if resp.status == 429:
            self.throttled_responses += 1
        raise classify(resp.status, resp.headers, resp.data)

    def _token_renewed(self, refused_token: str) -> bool:
        """After a 401: is there a newer token (in the file, or already re-read by the other thread)?"""
        with self._token_lock:
            if self._token != refused_token:
                return True
            if self._token_file is None:
                return False
            try:
                token = read_token_file(self._token_file)
            except ValueError:
                return False
            if token == refused_token:
                return False
            self._token = token
            return True

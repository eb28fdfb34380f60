"""The remote reward service: ``reward: {name: http, kwargs: {url: ...}}`` posts the samples to a service
the operator runs (a sandbox that executes code, a judge model, a grader) and reads one reward each.

The protocol (docs/engine.md, "Remote reward service") is OpenRLHF's remote reward server's, extended:
``POST <url>`` with a JSON body

    {"query": [prompt + response, ...], "prompts": [...], "responses": [...], "labels": [answer, ...],
     "metadata": [{...}, ...]}

(one entry per sample, in order) answered by ``200`` with ``{"rewards": [r, ...]}``, one per sample:
a number, ``{"score": number, <figure>: number, ...}`` (figures become metrics, as a plugin's), or
``null`` for a sample the service could not score. An OpenRLHF reward server answers this unchanged.

What a failure means, never a silent 0 that trains the policy on a broken grader:

- the samples of a dispatch go in batches of ``batch_size``, at most ``concurrency`` in flight;
- each request has ``timeout_s`` (connect, read, write and pool); a connection error, a timeout, a 5xx,
  408 or 429 is retried ``retries`` times, waiting ``backoff_s * 2**k`` (at most ``max_backoff_s``)
  between tries; any other answer (a 4xx, a body that is not the contract) is final at once;
- a batch that fails for good leaves its samples **unscored** (``None``): ``SafeReward`` counts them
  (``reward/unscored``), the trainer leaves them out of the update, and the driver raises an alert when
  a step's unscored share passes ``reward.unscored_alert_ratio``;
- a scoring call therefore takes at most about ``(retries + 1) * timeout_s`` plus the backoffs: the
  rollouter waits that long at worst, then goes on generating.

Which URLs a config may name is the deployment's decision: the engine checks the URL's shape
(``rl_engine.strict_url``: http(s), no user-info, query or encoding tricks); the platform accepts only
services its operator lists (``ALLOWED_REWARD_SERVICES``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from rl_engine.strict_url import UrlError, parse_strict_url
from rl_engine.types import Sample

log = logging.getLogger(__name__)
# httpx logs every request at INFO: thousands of lines a run. Its warnings still show; ours say what failed.
logging.getLogger("httpx").setLevel(logging.WARNING)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
MAX_BATCH = 4096
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class BatchFailed(Exception):
    """A batch the service did not score (the message says why); ``retry``: worth another try."""

    def __init__(self, message: str, *, retry: bool):
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True)
class ServiceStats:
    """What the client has done so far (cumulative): requests sent, retried, and batches given up."""

    requests: int
    retries: int
    failed_batches: int


class HttpReward:
    """Scores batches of samples on a remote reward service (module docstring: protocol, failures)."""

    def __init__(
        self,
        url: str,
        *,
        batch_size: int,
        concurrency: int,
        timeout_s: float,
        retries: int,
        backoff_s: float,
        max_backoff_s: float,
    ):
        self.url = url
        self.batch_size, self.concurrency = batch_size, concurrency
        self.timeout_s, self.retries = timeout_s, retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self._client: httpx.Client | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._requests = self._retries = self._failed = 0

    # --- the reward contract -----------------------------------------------------------------------------
    def __call__(self, sample: Sample) -> Any:
        result = self.score_batch([sample])[0]
        if result is None:
            raise RuntimeError(f"the reward service at {self.url} did not score the sample")
        return result

    def score_batch(self, samples: Sequence[Sample]) -> list[Any]:
        """One result per sample (a number, a mapping with ``score``, or None: unscored), in order."""
        batches = [samples[i : i + self.batch_size] for i in range(0, len(samples), self.batch_size)]
        if not batches:
            return []
        pool = self._executor()
        results: list[Any] = []
        for scored in pool.map(self._score_one_batch, batches):
            results.extend(scored)
        return results

    def stats(self) -> ServiceStats:
        with self._lock:
            return ServiceStats(self._requests, self._retries, self._failed)

    def close(self) -> None:
        with self._lock:
            client, pool, self._client, self._pool = self._client, self._pool, None, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if client is not None:
            client.close()

    # --- one batch ------------------------------------------------------------------------------------------
    def _score_one_batch(self, batch: Sequence[Sample]) -> list[Any]:
        body = request_body(batch)
        for attempt in range(self.retries + 1):
            with self._lock:
                self._requests += 1
            try:
                return self._post(body, len(batch))
            except BatchFailed as exc:
                if exc.retry and attempt < self.retries:
                    with self._lock:
                        self._retries += 1
                    time.sleep(min(self.max_backoff_s, self.backoff_s * 2**attempt))
                    continue
                with self._lock:
                    self._failed += 1
                log.warning(
                    "reward service %s: a batch of %d samples is unscored after %d tries: %s",
                    self.url,
                    len(batch),
                    attempt + 1,
                    exc,
                )
                return [None] * len(batch)
        raise AssertionError("unreachable")  # the loop returns on its last attempt

    def _post(self, body: dict[str, Any], n: int) -> list[Any]:
        try:
            response = self._http().post(self.url, json=body)
        except httpx.HTTPError as exc:  # connect / read / write / pool timeouts, refused, reset
            raise BatchFailed(f"{type(exc).__name__}: {str(exc)[:200]}", retry=True) from None
        if response.status_code != 200:
            raise BatchFailed(
                f"HTTP {response.status_code}: {response.text[:200]!r}",
                retry=response.status_code in RETRY_STATUS,
            )
        if len(response.content) > MAX_RESPONSE_BYTES:
            raise BatchFailed(f"an answer of {len(response.content)} bytes", retry=False)
        try:
            return parse_rewards(response.json(), n)
        except ValueError as exc:
            raise BatchFailed(f"the answer is not the protocol's: {exc}", retry=False) from None

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                limits = httpx.Limits(
                    max_connections=self.concurrency, max_keepalive_connections=self.concurrency
                )
                self._client = httpx.Client(
                    timeout=httpx.Timeout(self.timeout_s), limits=limits, follow_redirects=False
                )
            return self._client

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="reward-http")
            return self._pool

    def __getstate__(self) -> dict[str, Any]:  # a client and a pool do not travel (Ray pickles configs)
        state = dict(self.__dict__)
        state.update(_client=None, _pool=None, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def request_body(batch: Sequence[Sample]) -> dict[str, Any]:
    """The JSON body of one batch (module docstring): parallel lists, one entry per sample."""
    return {
        "query": [s.prompt_text + s.response_text for s in batch],
        "prompts": [s.prompt_text for s in batch],
        "responses": [s.response_text for s in batch],
        "labels": [s.answer for s in batch],
        "metadata": [s.metadata for s in batch],
    }


def parse_rewards(payload: Any, n: int) -> list[Any]:
    """The ``rewards`` of an answer to a batch of ``n``: a list of ``n`` numbers, mappings with a
    numeric ``score``, or None. ValueError (one line) for anything else: the whole batch is unscored."""
    if not isinstance(payload, Mapping) or "rewards" not in payload:
        raise ValueError("expected an object with 'rewards'")
    rewards = payload["rewards"]
    if not isinstance(rewards, list) or len(rewards) != n:
        got = len(rewards) if isinstance(rewards, list) else type(rewards).__name__
        raise ValueError(f"'rewards' must list {n} results, got {got}")
    for i, r in enumerate(rewards):
        if r is None:
            continue
        score = r.get("score") if isinstance(r, Mapping) else r
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise ValueError(f"rewards[{i}] is not a finite number, a mapping with 'score', or null")
    return rewards


def http_reward(
    url: str,
    batch_size: int = 32,
    concurrency: int = 4,
    timeout_s: float = 30.0,
    retries: int = 3,
    backoff_s: float = 0.5,
    max_backoff_s: float = 8.0,
) -> HttpReward:
    """A remote reward service: POSTs batches of samples as JSON to ``url``, one reward each back.

    ``batch_size`` samples per request, ``concurrency`` requests in flight, ``timeout_s`` per request,
    ``retries`` further tries (connection errors, timeouts, 5xx, 408, 429) after ``backoff_s * 2**k``
    seconds (at most ``max_backoff_s``). A batch that fails for good leaves its samples unscored: left out
    of the update and counted (``reward/unscored``), never scored 0."""
    try:
        parsed = parse_strict_url(url)
    except UrlError as exc:
        raise ValueError(f"url {str(url)[:200]!r} {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise ValueError(f"url {url[:200]!r}: the reward service must be http or https")
    checks = (
        ("batch_size", batch_size, 1, MAX_BATCH),
        ("concurrency", concurrency, 1, 64),
        ("retries", retries, 0, 10),
    )
    for name, value, lo, hi in checks:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
    for name, number, hi in (
        ("timeout_s", timeout_s, 600.0),
        ("backoff_s", backoff_s, 60.0),
        ("max_backoff_s", max_backoff_s, 600.0),
    ):
        if isinstance(number, bool) or not isinstance(number, int | float) or not 0 < number <= hi:
            raise ValueError(f"{name} must be a number in (0, {hi:g}], got {number!r}")
    return HttpReward(
        url,
        batch_size=batch_size,
        concurrency=concurrency,
        timeout_s=float(timeout_s),
        retries=retries,
        backoff_s=float(backoff_s),
        max_backoff_s=float(max_backoff_s),
    )

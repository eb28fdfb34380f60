"""The HTTP metrics sink: the engine reports to the platform's ingestion API like any tracking client.

Points, events and samples are queued in memory and sent in batches by one background thread; a second
thread posts heartbeats. The first point or event queued wakes the sender, which waits
``flush_interval_s`` (50 ms) for the rest of that step's records and sends them together: a point
reaches the platform within about 100 ms, and a fast engine still makes at most one request per
endpoint per interval. Samples (prompts and responses, larger and only browsed) wait up to
``samples_interval_s`` (1 s) and go in one request, so they do not delay the metrics behind them.

The sender has at most one request in flight (``ingest_client``: a keep-alive connection for the data,
another for heartbeats): what is logged while a request is answered waits and goes in the next one (up to
``MAX_POINTS_PER_REQUEST`` items a request). So its request rate follows the platform's answer time
instead of piling up requests on a busy server, and no request pays for a new TCP connection.

Every batch is first appended to a JSONL spool file on disk (``spool``), and a cursor file records how
many bytes of it were delivered, after each delivered batch: while the platform is unreachable the
backlog grows there and is delivered, in order, once it answers again — so a web-server restart mid-run
loses nothing, and a crash of the engine costs at most the one batch in flight being sent again.
Re-sending is harmless: metric ingestion is idempotent on (run, key, step), and event and sample batches
carry a ``batch_id`` (given when spooled) that the platform stores once.

What the platform answers decides what happens to a batch (``http_replies``): an outage or a 5xx is
retried with backoff, a 429 waits for ``Retry-After``, a batch refused as too large (413) is split in
halves, and one refused as malformed (400) is never retried: it is appended to
``<spool_dir>/run-<id>.rejected.jsonl`` and reported as an ``alert`` event (the rest of its batch, when
the answer names the bad items, is still sent). A refused token (401) is re-read from its file once (the
platform may have issued a new one); if it is unchanged, the sink stops delivering and keeps the spool.
Heartbeats also keep the token alive (the platform renews it on each): they go on every
``heartbeat_interval_s`` whatever the spool does, and after a 429 a heartbeat that is due is sent before
the spool resumes, so a throttled backlog never starves them.

The bodies are the ingestion wire format (``rl_engine.wire``, the definition the platform validates
with). Configured from the environment by ``build_sinks`` (``logging.sinks: [http]``) through
``rl_engine.jobspec.IngestSpec``: ``RL_ENGINE_INGEST_URL`` (the platform's base URL),
``RL_ENGINE_INGEST_TOKEN_FILE`` (an absolute path to a file holding the token: what the platform's
launcher sets) or ``RL_ENGINE_INGEST_TOKEN`` (the token itself, for a user of the CLI),
``RL_ENGINE_RUN_ID``; optional ``RL_ENGINE_SPOOL_DIR``, ``RL_ENGINE_HEARTBEAT_S``,
``RL_ENGINE_CLOSE_TIMEOUT_S``, ``RL_ENGINE_FLUSH_S`` (the wait after the first queued item, default 0.05).
"""

from __future__ import annotations

import math
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rl_engine import wire
from rl_engine.jobspec import IngestSpec
from rl_engine.sinks.base import MetricsSink
from rl_engine.sinks.http_replies import (
    AccessRefused,
    DeliveryRejected,
    Throttled,
    bad_item_indices,
    is_rejection_alert,
    rejection_alert,
    with_items,
)
from rl_engine.sinks.ingest_client import IngestClient, RequestObserver, read_token_file
from rl_engine.sinks.spool import Spool, SpooledBatch

MAX_POINTS_PER_REQUEST = 1000  # the server accepts up to 5000; smaller batches retry cheaply

__all__ = ["AccessRefused", "DeliveryRejected", "HttpSink", "Throttled", "read_token_file"]


class HttpSink(MetricsSink):
    """MetricsSink that posts to ``{url}/api/runs/{run_id}/{metrics|events|samples|heartbeat}``
    (``ingest_client``), through its spool (``spool``).

    ``token`` is the ingest token; with ``token_file`` (and no ``token``) it is read from that file, and
    read again when the platform refuses it (401), in case the platform wrote a new one. ``observer`` is
    told of every request (``ingest_client.RequestObserver``)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        run_id: int | str,
        *,
        token_file: str | Path | None = None,
        spool_dir: str | Path | None = None,
        flush_interval_s: float = 0.05,
        samples_interval_s: float = 1.0,
        heartbeat_interval_s: float = 10.0,
        request_timeout_s: float = 10.0,
        close_timeout_s: float = 60.0,
        max_backoff_s: float = 5.0,
        observer: RequestObserver | None = None,
    ) -> None:
        token_path = Path(token_file) if token_file else None
        if not token and token_path is not None:
            token = read_token_file(token_path)
        if not url or not token or not str(run_id):
            raise ValueError("HttpSink needs the platform URL, an ingest token and the run id")
        self.client = IngestClient(
            url, token, run_id, token_file=token_path, request_timeout_s=request_timeout_s, observer=observer
        )
        self.flush_interval_s = flush_interval_s
        self.samples_interval_s = samples_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.request_timeout_s = request_timeout_s
        self.close_timeout_s = close_timeout_s
        self.max_backoff_s = max_backoff_s
        self.spool = Spool(
            Path(spool_dir) if spool_dir else Path(tempfile.gettempdir()) / "rl_engine_spool", run_id
        )
        self._pending: list[tuple[str, dict[str, Any]]] = []  # (endpoint, one point or event)
        self._first_pending_at = 0.0  # monotonic time the oldest pending item was queued
        self._samples: list[dict[str, Any]] = []  # each with its step
        self._first_sample_at = 0.0
        self._cond = threading.Condition()
        self._closing = False
        self._backoff_s = 0.0
        # When to try the spooled backlog again after a failed delivery (None: nothing to retry). A spool
        # left by an earlier process (a crash) is delivered right away.
        self._retry_at: float | None = time.monotonic() if self.spool.backlog() > 0 else None
        self._throttled = False  # the spool's last attempt was a 429
        self._last_heartbeat_ok = time.monotonic()
        # Set when the platform refuses the token for good: nothing more is sent, the spool is kept.
        self.refused: AccessRefused | None = None
        self._stop_heartbeat = threading.Event()
        self.delivered_requests = 0
        self.last_error = ""  # the last retryable failure, for a report
        self._flusher = threading.Thread(target=self._flush_loop, name="http-sink-flush", daemon=True)
        self._flusher.start()
        self._heartbeat = threading.Thread(
            target=self._heartbeat_loop, name="http-sink-heartbeat", daemon=True
        )
        self._heartbeat.start()

    @classmethod
    def from_env(cls) -> HttpSink:
        """Build from RL_ENGINE_* variables; a clear error names the one that is missing or wrong.
        The token file (the platform's launcher) wins over a token in the environment (the CLI's)."""
        return cls.from_spec(IngestSpec.from_env())

    @classmethod
    def from_spec(cls, spec: IngestSpec) -> HttpSink:
        return cls(
            spec.url, spec.token, spec.run_id,
            token_file=spec.token_file,
            spool_dir=spec.spool_dir,
            flush_interval_s=spec.flush_s,
            heartbeat_interval_s=spec.heartbeat_s,
            close_timeout_s=spec.close_timeout_s,
        )  # fmt: skip

    # --- the MetricsSink interface ---------------------------------------------------------------------

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = time.time()
        points = [
            (wire.METRICS, wire.point(str(k), int(step), float(v), now))
            for k, v in metrics.items()
            if isinstance(v, int | float) and math.isfinite(float(v))  # JSON has no NaN/inf
        ]
        self._enqueue(points)

    def log_event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        self._enqueue([(wire.EVENTS, wire.event(kind, message, data))])

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        if not samples:
            return
        with self._cond:
            if self._closing:
                raise RuntimeError("HttpSink is closed")
            if not self._samples:
                self._first_sample_at = time.monotonic()
                self._cond.notify_all()
            self._samples.extend(wire.sample(sample, step) for sample in samples)

    def close(self) -> None:
        """Deliver everything still queued (waiting out a platform outage up to close_timeout_s)."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        self._flusher.join(timeout=self.close_timeout_s + self.request_timeout_s + 5)
        self._stop_heartbeat.set()
        self._heartbeat.join(timeout=self.request_timeout_s + 1)
        self.client.close()
        if self.spool.backlog() > 0 and self.refused is None:  # a refusal was reported when it came
            print(
                f"http sink: the platform was unreachable; undelivered data is in {self.spool.path}",
                file=sys.stderr,
            )

    def backlog(self) -> int:
        """Bytes recorded and not yet delivered (the spool's)."""
        return self.spool.backlog()

    @property
    def throttled_responses(self) -> int:
        """429 answers seen (data and heartbeats)."""
        return self.client.throttled_responses

    # --- internals ---------------------------------------------------------------------------------------

    def _enqueue(self, items: list[tuple[str, Any]], *, internal: bool = False) -> None:
        if not items:
            return
        with self._cond:
            if self._closing and not internal:  # the sink's own alerts are still sent while it drains
                raise RuntimeError("HttpSink is closed")
            if not self._pending:
                self._first_pending_at = time.monotonic()
                self._cond.notify_all()  # the sender starts its flush_interval_s wait now
            self._pending.extend(items)
            if len(self._pending) >= MAX_POINTS_PER_REQUEST:
                self._cond.notify_all()

    def _take_batches(self, closing: bool) -> list[tuple[str, dict[str, Any]]]:
        """Group pending items into request bodies, preserving order per endpoint (samples only once
        they have waited samples_interval_s, or when closing)."""
        with self._cond:
            items, self._pending = self._pending, []
            samples_due = closing or time.monotonic() >= self._first_sample_at + self.samples_interval_s
            samples, self._samples = (self._samples, []) if samples_due else ([], self._samples)
        # One request for all steps' samples (each names its step): a request per step could not keep
        # up with a fast engine, and the backlog would hold back the metrics queued behind it.
        lists = {
            wire.METRICS: [body for ep, body in items if ep == wire.METRICS],
            wire.EVENTS: [body for ep, body in items if ep == wire.EVENTS],
            wire.SAMPLES: samples,
        }
        batches: list[tuple[str, dict[str, Any]]] = []
        for endpoint, records in lists.items():
            for i in range(0, len(records), MAX_POINTS_PER_REQUEST):
                batches.append((endpoint, {wire.ITEMS[endpoint]: records[i : i + MAX_POINTS_PER_REQUEST]}))
        return batches

    def _wait_for_work(self) -> None:
        """Under the condition: return once the pending items have waited ``flush_interval_s`` (or fill a
        request), once a failed delivery is due for its retry, or when the sink closes; sleep otherwise
        (an idle sink does not wake up)."""
        while not self._closing:
            now = time.monotonic()
            due = []
            if self._pending:
                full = len(self._pending) >= MAX_POINTS_PER_REQUEST
                due.append(now if full else self._first_pending_at + self.flush_interval_s)
            if self._samples:
                due.append(self._first_sample_at + self.samples_interval_s)
            wake: float | None = min(due) if due else None
            if self._retry_at is not None:  # the platform was unreachable: no request before the retry
                wake = self._retry_at if wake is None else max(wake, self._retry_at)
            if wake is not None and now >= wake:
                return
            self._cond.wait(None if wake is None else wake - now)

    def _flush_loop(self) -> None:
        deadline: float | None = None
        while True:
            with self._cond:
                self._wait_for_work()
                closing = self._closing
            if closing and deadline is None:
                deadline = time.monotonic() + self.close_timeout_s
            for endpoint, body in self._take_batches(closing):
                self.spool.append(endpoint, body)  # kept even when nothing can be sent any more
            self._deliver_spool()
            if closing:
                with self._cond:
                    drained = not self._pending and not self._samples
                if drained and (self.spool.backlog() == 0 or self.refused is not None):
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    return
                if self._retry_at is not None and deadline is not None:  # a backoff or a Retry-After
                    time.sleep(max(0.0, min(self._retry_at, deadline) - time.monotonic()))

    def _deliver_spool(self) -> None:
        """Send spooled requests in order from the cursor, recording the cursor after each one; stop at
        the first failure worth retrying (the rest waits for the retry) or when the token is refused."""
        if self.refused is not None or self.spool.backlog() == 0:
            return
        try:
            if self._throttled and time.monotonic() - self._last_heartbeat_ok >= self.heartbeat_interval_s:
                self._send_due_heartbeat()  # the token lives on heartbeats: a due one goes before the backlog
            for batch, offset in self.spool.undelivered():
                if batch is not None:
                    self._deliver(batch.endpoint, batch.body)
                self.spool.delivered_to(offset)  # a crash from here on re-sends nothing already delivered
                self._backoff_s, self._retry_at, self._throttled = 0.0, None, False
        except AccessRefused as exc:
            self._refuse(exc)
        except Throttled as exc:
            self._schedule_retry(exc, retry_after_s=exc.retry_after_s)
            self._throttled = True
        except OSError as exc:  # no answer, a 5xx: try again later
            self._schedule_retry(exc)

    def _deliver(self, endpoint: str, body: dict[str, Any]) -> None:
        """Post one spooled batch. One refused as too large (413) is sent as two halves; the items one
        refused as malformed (400) names are dropped and the rest sent; what cannot be sent at all is
        recorded and reported (``_reject``), never retried. Retryable failures propagate."""
        try:
            self.client.post(endpoint, body)
            self.delivered_requests += 1
            return
        except AccessRefused:
            raise
        except DeliveryRejected as exc:
            rejected = exc
        field = wire.ITEMS.get(endpoint, "")
        items = body.get(field) or []
        if rejected.status == 413 and len(items) > 1:
            half = len(items) // 2
            for k, part in enumerate((items[:half], items[half:])):
                self._deliver(endpoint, with_items(body, field, part, f".{k}"))  # own ids: stored once
            return
        bad = bad_item_indices(rejected.response, field, len(items)) if rejected.status == 400 else None
        if bad is None or len(bad) == len(items):
            self._reject(endpoint, body, rejected)
            return
        # The answer named the malformed items: only they are dropped. Refused whole, the batch stored
        # nothing, so the rest may keep its id.
        self._reject(
            endpoint, with_items(body, field, [x for i, x in enumerate(items) if i in bad]), rejected
        )
        self._deliver(endpoint, with_items(body, field, [x for i, x in enumerate(items) if i not in bad]))

    def _reject(self, endpoint: str, body: dict[str, Any], exc: DeliveryRejected) -> None:
        """A batch the platform will never accept: kept in the rejected log, reported by an alert event."""
        self.spool.reject(SpooledBatch(endpoint, body), exc.status, exc.response)
        print(
            f"http sink: the platform rejected a {endpoint} batch (HTTP {exc.status}); it is kept in "
            f"{self.spool.rejected_path}: {exc}",
            file=sys.stderr,
        )
        if not is_rejection_alert(endpoint, body):  # an alert about a refused alert could be refused too
            self._enqueue([(wire.EVENTS, rejection_alert(endpoint, exc.status, exc.response))], internal=True)

    def _schedule_retry(self, exc: BaseException, retry_after_s: float | None = None) -> None:
        """A delivery failed in a way worth retrying: wait what a 429 asked for, else back off (0.25 s,
        doubling up to max_backoff_s; also after a 429 that named no wait)."""
        if retry_after_s is None:
            self._backoff_s = min(self.max_backoff_s, max(0.25, self._backoff_s * 2))
        self._retry_at = time.monotonic() + (self._backoff_s if retry_after_s is None else retry_after_s)
        self.last_error = str(exc)

    def _refuse(self, exc: AccessRefused) -> None:
        """The platform refuses this sink for good: stop sending (once, said once), keep the spool."""
        with self._cond:
            if self.refused is not None:
                return
            self.refused = exc
            self._retry_at = None
            self._cond.notify_all()
        self._stop_heartbeat.set()
        print(
            f"http sink: the platform refuses this run's ingest token ({exc}); nothing more is sent. "
            f"Everything recorded is kept in {self.spool.path} (delivered up to the byte offset in "
            f"{self.spool.cursor_path.name}).",
            file=sys.stderr,
        )

    def _send_heartbeat(self, *, own_connection: bool = False) -> None:
        self.client.post(wire.HEARTBEAT, {}, heartbeat=own_connection)
        self._last_heartbeat_ok = time.monotonic()

    def _send_due_heartbeat(self) -> None:
        """The flusher's heartbeat, after a 429 (a refused token or a retryable failure propagates)."""
        try:
            self._send_heartbeat()
        except AccessRefused:
            raise
        except DeliveryRejected:  # the heartbeat thread keeps trying; the backlog must not wait on it
            pass

    def _heartbeat_loop(self) -> None:
        """Every heartbeat_interval_s, whatever the spool does (a backlog's 429 never holds this thread);
        after a 429 of its own, again as soon as the platform allows."""
        while True:
            wait = self.heartbeat_interval_s
            try:
                self._send_heartbeat(own_connection=True)
            except AccessRefused as exc:
                self._refuse(exc)
                return
            except Throttled as exc:
                wait = min(wait, exc.retry_after_s or wait)
            except (OSError, DeliveryRejected):
                pass
            if self._stop_heartbeat.wait(wait):
                return

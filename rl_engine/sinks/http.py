"""The HTTP metrics sink: the engine reports to the platform's ingestion API like any tracking client.

Points, events and samples are queued in memory and sent in batches by one background thread; a second
thread posts heartbeats. The first point or event queued wakes the sender, which waits
``flush_interval_s`` (50 ms) for the rest of that step's records and sends them together: a point
reaches the platform within about 100 ms, and a fast engine still makes at most one request per
endpoint per interval. Samples (prompts and responses, larger and only browsed) wait up to
``samples_interval_s`` (1 s) and go in one request, so they do not delay the metrics behind them.

Every batch is first appended to a JSONL spool file on disk, and a cursor file records how many bytes
of it were delivered, after each delivered batch: while the platform is unreachable the backlog grows
there and is delivered, in order, once it answers again — so a web-server restart mid-run loses
nothing, and a crash of the engine costs at most the one batch in flight being sent again. Re-sending
is harmless: metric ingestion is idempotent on (run, key, step), and event and sample batches carry a
``batch_id`` (given when spooled) that the platform stores once.

Configured from the environment by ``build_sinks`` (``logging.sinks: [http]``):
``RL_ENGINE_INGEST_URL`` (the platform's base URL), ``RL_ENGINE_INGEST_TOKEN``, ``RL_ENGINE_RUN_ID``;
optional ``RL_ENGINE_SPOOL_DIR``, ``RL_ENGINE_HEARTBEAT_S``, ``RL_ENGINE_CLOSE_TIMEOUT_S``,
``RL_ENGINE_FLUSH_S`` (the wait after the first queued item, default 0.05).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

try:  # subclass the engine's interface when it exists; the methods below are that interface
    from rl_engine.sinks import MetricsSink as _Base  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - only while the engine's sinks package is being written
    _Base = object  # type: ignore[assignment,misc]

MAX_POINTS_PER_REQUEST = 1000  # the server accepts up to 5000; smaller batches retry cheaply
_RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class DeliveryRejected(RuntimeError):
    """The platform answered with a non-retryable error (bad token, invalid body): do not retry."""


class HttpSink(_Base):  # type: ignore[misc,valid-type]
    """MetricsSink that posts to ``{url}/api/runs/{run_id}/{metrics|events|samples|heartbeat}``."""

    def __init__(
        self,
        url: str,
        token: str,
        run_id: int | str,
        *,
        spool_dir: str | Path | None = None,
        flush_interval_s: float = 0.05,
        samples_interval_s: float = 1.0,
        heartbeat_interval_s: float = 10.0,
        request_timeout_s: float = 10.0,
        close_timeout_s: float = 60.0,
        max_backoff_s: float = 5.0,
    ) -> None:
        if not url or not token or not str(run_id):
            raise ValueError("HttpSink needs the platform URL, an ingest token and the run id")
        self.base = f"{url.rstrip('/')}/api/runs/{run_id}"
        self._headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        self.flush_interval_s = flush_interval_s
        self.samples_interval_s = samples_interval_s
        self.request_timeout_s = request_timeout_s
        self.close_timeout_s = close_timeout_s
        self.max_backoff_s = max_backoff_s
        spool_root = Path(spool_dir) if spool_dir else Path(tempfile.gettempdir()) / "rl_engine_spool"
        spool_root.mkdir(parents=True, exist_ok=True)
        self.spool_path = spool_root / f"run-{run_id}.jsonl"
        self._cursor_path = spool_root / f"run-{run_id}.cursor"
        self._pending: list[tuple[str, dict[str, Any]]] = []  # (endpoint, one point or event)
        self._first_pending_at = 0.0  # monotonic time the oldest pending item was queued
        self._samples: list[dict[str, Any]] = []  # each with its step
        self._first_sample_at = 0.0
        self._cond = threading.Condition()
        self._closing = False
        self._backoff_s = 0.0
        # When to try the spooled backlog again after a failed delivery (None: nothing to retry). A spool
        # left by an earlier process (a crash) is delivered right away.
        self._retry_at: float | None = time.monotonic() if self._spool_backlog() > 0 else None
        self._stop_heartbeat = threading.Event()
        self.delivered_requests = 0
        self._last_error = ""
        self._flusher = threading.Thread(target=self._flush_loop, name="http-sink-flush", daemon=True)
        self._flusher.start()
        self._heartbeat = threading.Thread(
            target=self._heartbeat_loop, args=(heartbeat_interval_s,), name="http-sink-heartbeat", daemon=True
        )
        self._heartbeat.start()

    @classmethod
    def from_env(cls) -> HttpSink:
        """Build from RL_ENGINE_* variables; a clear error names the one that is missing."""
        env = os.environ
        missing = [
            n
            for n in ("RL_ENGINE_INGEST_URL", "RL_ENGINE_INGEST_TOKEN", "RL_ENGINE_RUN_ID")
            if not env.get(n)
        ]
        if missing:
            raise ValueError(f"logging.sinks includes 'http' but {', '.join(missing)} is not set")
        return cls(
            env["RL_ENGINE_INGEST_URL"], env["RL_ENGINE_INGEST_TOKEN"], env["RL_ENGINE_RUN_ID"],
            spool_dir=env.get("RL_ENGINE_SPOOL_DIR") or None,
            flush_interval_s=float(env.get("RL_ENGINE_FLUSH_S", "0.05")),
            heartbeat_interval_s=float(env.get("RL_ENGINE_HEARTBEAT_S", "10")),
            close_timeout_s=float(env.get("RL_ENGINE_CLOSE_TIMEOUT_S", "60")),
        )  # fmt: skip

    # --- the MetricsSink interface ---------------------------------------------------------------------

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = time.time()
        points = [
            ("metrics", {"key": str(k), "step": int(step), "value": float(v), "wall_time": now})
            for k, v in metrics.items()
            if isinstance(v, int | float) and math.isfinite(float(v))  # JSON has no NaN/inf
        ]
        self._enqueue(points)

    def log_event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        self._enqueue([("events", {"kind": kind, "message": message, "data": data or {}})])

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        if not samples:
            return
        with self._cond:
            if self._closing:
                raise RuntimeError("HttpSink is closed")
            if not self._samples:
                self._first_sample_at = time.monotonic()
                self._cond.notify_all()
            self._samples.extend({**sample, "step": int(step)} for sample in samples)

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
        if self._spool_backlog() > 0:
            print(
                f"http sink: the platform was unreachable; undelivered data is in {self.spool_path}",
                file=sys.stderr,
            )

    # --- internals ---------------------------------------------------------------------------------------

    def _enqueue(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        if not items:
            return
        with self._cond:
            if self._closing:
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
        points = [body for ep, body in items if ep == "metrics"]
        events = [body for ep, body in items if ep == "events"]
        batches: list[tuple[str, dict[str, Any]]] = []
        for i in range(0, len(points), MAX_POINTS_PER_REQUEST):
            batches.append(("metrics", {"points": points[i : i + MAX_POINTS_PER_REQUEST]}))
        for i in range(0, len(events), MAX_POINTS_PER_REQUEST):
            batches.append(("events", {"events": events[i : i + MAX_POINTS_PER_REQUEST]}))
        # One request for all steps' samples (each names its step): a request per step could not keep
        # up with a fast engine, and the backlog would hold back the metrics queued behind it.
        for i in range(0, len(samples), MAX_POINTS_PER_REQUEST):
            batches.append(("samples", {"samples": samples[i : i + MAX_POINTS_PER_REQUEST]}))
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
                self._spool_append(endpoint, body)
            self._deliver_spool()
            if closing:
                with self._cond:
                    drained = not self._pending and not self._samples
                if drained and self._spool_backlog() == 0:
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    return
                time.sleep(min(self._backoff_s, max(0.0, deadline - time.monotonic())) if deadline else 0)

    def _deliver_spool(self) -> None:
        """Send spooled requests in order from the cursor, recording the cursor after each one; stop at
        the first retryable failure (the rest waits for the retry)."""
        if self._spool_backlog() == 0:
            return
        offset = self._read_cursor()
        with open(self.spool_path, "rb") as fh:
            fh.seek(offset)
            for raw in fh:
                try:
                    record = json.loads(raw)
                except ValueError:  # a torn last line (crash mid-write): skip it
                    offset += len(raw)
                    continue
                try:
                    self._post(record["endpoint"], record["body"])
                except DeliveryRejected as exc:
                    print(f"http sink: dropped a {record['endpoint']} batch the platform rejected: {exc}",
                          file=sys.stderr)  # fmt: skip
                except (OSError, urllib.error.URLError) as exc:
                    self._schedule_retry(exc)
                    return
                else:
                    self.delivered_requests += 1
                offset += len(raw)
                self._write_cursor(offset)  # a crash from here on re-sends nothing already delivered
                self._backoff_s, self._retry_at = 0.0, None
        if offset >= self.spool_path.stat().st_size:
            self._reset_spool()

    def _schedule_retry(self, exc: BaseException) -> None:
        """A delivery failed in a way worth retrying: back off (0.25 s, doubling up to max_backoff_s)."""
        self._backoff_s = min(self.max_backoff_s, max(0.25, self._backoff_s * 2))
        self._retry_at = time.monotonic() + self._backoff_s
        self._last_error = str(exc)

    def _post(self, endpoint: str, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.base}/{endpoint}", data=data, headers=self._headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.request_timeout_s) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code in _RETRYABLE_STATUS:
                raise OSError(f"HTTP {exc.code}") from exc
            detail = exc.read()[:300].decode(errors="replace")
            raise DeliveryRejected(f"HTTP {exc.code}: {detail}") from exc

    def _heartbeat_loop(self, interval_s: float) -> None:
        while True:
            with contextlib.suppress(OSError, urllib.error.URLError, DeliveryRejected):
                self._post("heartbeat", {})
            if self._stop_heartbeat.wait(interval_s):
                return

    # The spool: every batch is appended before it is sent, and the cursor records what was delivered,
    # so a platform outage (or a crash between send and acknowledgement) costs a resend, never a loss.
    def _spool_append(self, endpoint: str, body: dict[str, Any]) -> None:
        if endpoint in ("events", "samples"):  # stored once by the platform however often it is sent
            body = {**body, "batch_id": uuid.uuid4().hex}
        with open(self.spool_path, "ab") as fh:
            fh.write(json.dumps({"endpoint": endpoint, "body": body}).encode() + b"\n")

    def _spool_backlog(self) -> int:
        try:
            return self.spool_path.stat().st_size - self._read_cursor()
        except FileNotFoundError:
            return 0

    def _read_cursor(self) -> int:
        try:
            return int(self._cursor_path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _write_cursor(self, offset: int) -> None:
        tmp = self._cursor_path.with_suffix(".tmp")
        tmp.write_text(str(offset))
        tmp.replace(self._cursor_path)

    def _reset_spool(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.spool_path.unlink()
        with contextlib.suppress(FileNotFoundError):
            self._cursor_path.unlink()

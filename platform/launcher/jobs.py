"""Thin, typed helpers over Ray's Jobs API (the only place that talks to a cluster about jobs).

Everything takes the cluster's dashboard URL (``http://host:8265``). Errors from Ray surface as
:class:`ClusterUnreachable` (retry later) or :class:`JobNotFound` (the job is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

TERMINAL_JOB_STATES = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
_ERROR_TAIL_LINES = 15


class ClusterUnreachable(RuntimeError):
    """The Jobs API did not answer (network, head down): the caller retries or gives up with a reason."""


class JobNotFound(LookupError):
    """The cluster answers but knows no job with that submission id."""


@dataclass(frozen=True)
class JobState:
    status: str  # PENDING | RUNNING | STOPPED | SUCCEEDED | FAILED
    message: str
    exit_code: int | None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_JOB_STATES


def _client(address: str) -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # Ray raises ConnectionError/RuntimeError/ValueError depending on the failure
        raise ClusterUnreachable(f"cannot reach the Ray cluster at {address}: {exc}") from exc


def _is_not_found(exc: Exception) -> bool:
    text = str(exc).lower()
    return "does not exist" in text or "404" in text or "not found" in text


def submit(
    address: str,
    *,
    submission_id: str,
    entrypoint: str,
    env: dict[str, str],
    metadata: dict[str, str],
    timeout: float = 30.0,
) -> str:
    """Submit a job under a fixed submission id. If that id already exists (a previous attempt of the
    same start got this far before dying) the existing job is kept: no second start."""
    client = _client(address)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.submit_job(
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env={"env_vars": env},
                metadata=metadata,
            )
        except Exception as exc:
            text = str(exc)
            if "already exists" in text or "already been used" in text:
                return submission_id
            # Right after a head starts its agent may not be ready yet ("No available agent").
            if "No available agent" in text and time.monotonic() < deadline:
                time.sleep(1.0)
                continue
            raise ClusterUnreachable(f"job submission to {address} failed: {text}") from exc


def state(address: str, submission_id: str) -> JobState:
    client = _client(address)
    try:
        info = client.get_job_info(submission_id)
    except Exception as exc:
        if _is_not_found(exc):
            raise JobNotFound(submission_id) from exc
        raise ClusterUnreachable(f"cannot read job {submission_id} at {address}: {exc}") from exc
    return JobState(
        status=str(getattr(info.status, "value", info.status)),
        message=info.message or "",
        exit_code=getattr(info, "driver_exit_code", None),
    )


def logs(address: str, submission_id: str) -> str:
    client = _client(address)
    try:
        return client.get_job_logs(submission_id) or ""
    except Exception as exc:
        if _is_not_found(exc):
            raise JobNotFound(submission_id) from exc
        raise ClusterUnreachable(f"cannot read logs of {submission_id} at {address}: {exc}") from exc


class LogFollower:
    """Follows a job's log through the Jobs API's streaming endpoint (Ray's log-tail websocket) in a
    thread of its own: ``take()`` returns what arrived since the last call, so following a job costs
    what it prints, not the length of its log at every poll (``logs()`` returns the whole log).

    The stream starts at the beginning of the log; its first ``skip`` characters (what an earlier
    supervisor already turned into events) are dropped as they arrive. It ends by itself once the job
    is finished and its log read to the end; a stream that broke off sets ``error`` instead."""

    RECENT_CHARS = 64_000  # kept for the error text of a failed job (its last traceback)

    def __init__(self, address: str, submission_id: str, *, skip: int = 0) -> None:
        self.address, self.submission_id = address, submission_id
        self._skip = skip
        self._lock = threading.Lock()
        self._new: list[str] = []
        self._recent = ""
        self.received_chars = 0  # everything the stream delivered, skipped part included
        self.ended = threading.Event()
        self.error: str | None = None
        self._loop = asyncio.new_event_loop()
        self._task = self._loop.create_task(self._follow())
        self._thread = threading.Thread(target=self._run, name=f"log-{submission_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            self._loop.run_until_complete(self._task)
        self._loop.close()

    async def _follow(self) -> None:
        try:
            client = _client(self.address)
            async for chunk in client.tail_job_logs(self.submission_id):
                self._add(chunk)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the cluster went away, the websocket broke off: the caller falls back
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ended.set()

    def _add(self, chunk: str) -> None:
        with self._lock:
            self.received_chars += len(chunk)
            if self._skip:
                dropped = min(self._skip, len(chunk))
                chunk, self._skip = chunk[dropped:], self._skip - dropped
            if chunk:
                self._new.append(chunk)
                self._recent = (self._recent + chunk)[-self.RECENT_CHARS :]

    def take(self) -> str:
        """The text that arrived since the last call."""
        with self._lock:
            out, self._new = "".join(self._new), []
        return out

    def recent(self) -> str:
        """The last RECENT_CHARS characters of the log seen so far."""
        with self._lock:
            return self._recent

    @property
    def broken(self) -> bool:
        return self.error is not None

    def wait_finished(self, timeout: float) -> bool:
        """True once the stream ended after the job's last line (not when it broke off)."""
        return self.ended.wait(timeout) and not self.broken

    def close(self) -> None:
        if not self.ended.is_set():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout=10)


def stop(address: str, submission_id: str) -> bool:
    """Ask Ray to stop the job: SIGTERM to the driver (the engine checkpoints and exits), then SIGKILL
    after the cluster's RAY_JOB_STOP_WAIT_TIME_S. Returns False if the job was already finished."""
    client = _client(address)
    try:
        return bool(client.stop_job(submission_id))
    except Exception as exc:
        if _is_not_found(exc):
            raise JobNotFound(submission_id) from exc
        raise ClusterUnreachable(f"cannot stop job {submission_id} at {address}: {exc}") from exc


def wait_terminal(address: str, submission_id: str, timeout: float, poll_s: float = 0.25) -> JobState | None:
    """Poll until the job is terminal; None when the timeout passes first."""
    deadline = time.monotonic() + timeout
    while True:
        current = state(address, submission_id)
        if current.terminal:
            return current
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


def stop_all(address: str, timeout: float = 15.0, prefix: str = "") -> list[str]:
    """Stop every unfinished job (whose submission id starts with ``prefix``) and wait for them."""
    client = _client(address)
    stopped = []
    for job in client.list_jobs():
        sid = job.submission_id or ""
        if (
            sid
            and sid.startswith(prefix)
            and str(getattr(job.status, "value", job.status)) not in TERMINAL_JOB_STATES
        ):
            with contextlib.suppress(Exception):
                client.stop_job(sid)
                stopped.append(sid)
    deadline = time.monotonic() + timeout
    for sid in stopped:
        with contextlib.suppress(Exception):
            wait_terminal(address, sid, timeout=max(0.0, deadline - time.monotonic()))
    return stopped


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def clean_log_line(line: str) -> str:
    """A job log line as a run event shows it: no terminal colour codes, no line ending."""
    return _ANSI.sub("", line).rstrip("\r\n")


_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):", re.MULTILINE)
# Ray's own job-manager wrapper text, not the engine's words.
_RAY_NOISE = re.compile(r"^(\(raylet\)|\(pid=|---------------------------------------|Job '.*' failed)")


def error_from_logs(log_text: str, fallback: str = "") -> str:
    """The engine's own error: the last traceback (capped to its last lines), else the last log lines.

    A crash in a Ray actor surfaces in the driver's traceback too, so the driver log is enough.
    """
    text = log_text.rstrip()
    matches = list(_TRACEBACK.finditer(text))
    if matches:
        block = text[matches[-1].start() :].splitlines()
        if len(block) > _ERROR_TAIL_LINES:
            block = [block[0], "  ...", *block[-(_ERROR_TAIL_LINES - 2) :]]
        return "\n".join(block)
    lines = [ln for ln in text.splitlines() if ln.strip() and not _RAY_NOISE.match(ln)]
    # The engine's CLI reports user errors as one "error: ..." line (no traceback): that line is the error.
    errors = [i for i, ln in enumerate(lines) if ln.lower().startswith("error:")]
    if errors:
        return "\n".join(lines[errors[-1] :][:_ERROR_TAIL_LINES])
    if lines:
        return "\n".join(lines[-5:])
    return fallback.strip()[-2000:]

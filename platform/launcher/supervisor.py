"""Following a run's Ray job (status, log tail, heartbeats), cancelling it, and the periodic sweep.

One supervisor per run at a time, guaranteed by the lease in :class:`launcher.models.Supervision`.
A supervisor that dies (worker ``kill -9``) stops renewing; the sweep reserves the run again and a new
``supervise_run`` re-attaches by the stored job id.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from experiments.models import TERMINAL_STATES, Provider, Run, RunState
from experiments.services import InvalidTransition, run_heartbeat, run_transition
from launcher import jobs, ray_local
from launcher.models import Supervision
from launcher.services import (
    BUSY_STATES,
    job_stop_quietly,
    lease_acquire,
    lease_release,
    lease_renew,
    lease_s,
    run_finish_from_job,
    setting,
)
from rl_engine.wire import EventKind
from tracking.models import Checkpoint
from tracking.services import NewEvent, events_append_many

log = logging.getLogger(__name__)

MAX_LINES_PER_COMMIT = 1000  # log lines turned into events per transaction
RESERVE_S = 30  # how long a sweep's reservation waits for the task it enqueued
UNREACHABLE_WARN_EVERY_S = 30.0  # an unreachable cluster is polled every second, logged this often


def poll_s() -> float:
    return float(setting("LAUNCHER_POLL_S", 1.0))


class LeaseLost(RuntimeError):
    """Another supervisor owns the run now: this one must stop without writing anything more."""


class LogTail:
    """Turns a job's log into ``log`` events as the job prints it.

    The text comes from a :class:`jobs.LogFollower` (Ray's streaming endpoint), so a poll costs what is
    new, not the log's length. Complete lines are committed as events together with the new offset, in
    one transaction and only while we hold the lease: two supervisors overlapping after a re-attach can
    never emit the same line twice, and a new supervisor starts streaming past what was committed.
    """

    FINAL_WAIT_S = 10.0  # for the stream to end after the job did (Ray re-checks the file every second)
    RESTART_AFTER_S = 5.0  # a stream that broke off (cluster unreachable) is opened again this often

    def __init__(self, run: Run, owner: str) -> None:
        self.run_id, self.owner = run.pk, owner
        self.address, self.job = run.cluster_address, run.ray_job_id
        self.offset = Supervision.objects.filter(run_id=run.pk).values_list("log_offset", flat=True).get()
        self.pending = ""  # streamed past ``offset`` but not committed yet (the incomplete last line)
        self._open()

    def _open(self) -> None:
        self.follower = jobs.LogFollower(self.address, self.job, skip=self.offset)
        self.opened_at = time.monotonic()

    def close(self) -> None:
        self.follower.close()

    def poll(self, *, final: bool) -> str:
        """Commit the new complete lines (everything, when the job has ended: ``final``); returns the end
        of the log seen so far (where the engine's error is)."""
        if final and not self.follower.wait_finished(self.FINAL_WAIT_S):
            return self._from_whole_log()
        self.pending += self.follower.take()
        self._commit(final)
        if self.follower.broken and time.monotonic() - self.opened_at >= self.RESTART_AFTER_S:
            self.follower.close()
            self.pending = ""  # streamed again from the committed offset
            self._open()
        return self.follower.recent()

    def _from_whole_log(self) -> str:
        """The stream did not end cleanly: read the whole log once (the job has ended, it no longer grows)."""
        text = jobs.logs(self.address, self.job)
        self.pending = text[self.offset :]
        self._commit(final=True)
        return text

    def _commit(self, final: bool) -> None:
        ready = self.pending if final else self.pending[: self.pending.rfind("\n") + 1]
        lines = ready.splitlines(keepends=True)
        for i in range(0, len(lines), MAX_LINES_PER_COMMIT):
            chunk = lines[i : i + MAX_LINES_PER_COMMIT]
            size = sum(len(ln) for ln in chunk)
            with transaction.atomic():
                sup = Supervision.objects.select_for_update().get(run_id=self.run_id)
                if sup.owner != self.owner or sup.log_offset != self.offset:
                    raise LeaseLost(self.run_id)
                events = [
                    NewEvent(kind=EventKind.LOG, message=jobs.clean_log_line(ln))
                    for ln in chunk
                    if ln.strip()
                ]
                events_append_many(run_id=self.run_id, events=events)
                Supervision.objects.filter(run_id=self.run_id).update(
                    log_offset=self.offset + size, lease_until=timezone.now() + timedelta(seconds=lease_s())
                )
            self.offset += size
            self.pending = self.pending[size:]


def _drain_logs_quietly(run: Run, owner: str, tail: LogTail | None = None) -> str:
    """The job's last lines as events (with ``tail``, the supervisor's open stream), errors ignored."""
    own = tail is None
    try:
        tail = tail or LogTail(run, owner)
        return tail.poll(final=True)
    except (jobs.JobNotFound, jobs.ClusterUnreachable, LeaseLost, Supervision.DoesNotExist):
        return ""
    finally:
        if own and tail is not None:
            tail.close()


def supervise(*, run_id: int, owner: str) -> str:
    """Follow the run's job until the run is terminal. Returns the outcome (a state, or why we left)."""
    if not lease_acquire(run_id=run_id, owner=owner, seconds=lease_s()):
        return "supervised elsewhere"
    try:
        return _follow(run_id, owner)
    except LeaseLost:
        return "lease lost"
    except (Run.DoesNotExist, Supervision.DoesNotExist):
        return "run deleted"
    finally:
        lease_release(run_id=run_id, owner=owner)


def _follow(run_id: int, owner: str) -> str:
    stop_sent = False
    last_warned = -UNREACHABLE_WARN_EVERY_S
    tail: LogTail | None = None
    try:
        while True:
            run = Run.objects.get(pk=run_id)
            if run.state in TERMINAL_STATES:
                # Finished elsewhere (cancel task, reaper): collect the last lines, make sure the job is gone.
                if run.ray_job_id and run.cluster_address:
                    _drain_logs_quietly(run, owner, tail)
                    job_stop_quietly(run)
                return run.state
            if run.state not in (RunState.RUNNING, RunState.CANCELLING) or not run.ray_job_id:
                return f"nothing to supervise in state {run.state}"
            try:
                job = jobs.state(run.cluster_address, run.ray_job_id)
                if run.state == RunState.CANCELLING and not stop_sent:
                    job_stop_quietly(run)
                    stop_sent = True
                tail = tail or LogTail(run, owner)
                text = tail.poll(final=job.terminal)
            except jobs.JobNotFound:
                reason = (f"the Ray job {run.ray_job_id} no longer exists on {run.cluster_address} "
                          "(was the cluster restarted?)")  # fmt: skip
                return run_finish_from_job(run=run, job=None, log_text="", reason=reason)
            except jobs.ClusterUnreachable as exc:
                if run.provider == Provider.LOCAL and ray_local.is_gone(run.cluster_address):
                    reason = (f"the platform's local Ray head at {run.cluster_address} was stopped while the run "
                              "was active (platform restart?); resume the run from its last checkpoint")  # fmt: skip
                    return run_finish_from_job(run=run, job=None, log_text="", reason=reason)
                # Maybe a passing outage: no heartbeat meanwhile; if it lasts, the reaper fails the run.
                if time.monotonic() - last_warned >= UNREACHABLE_WARN_EVERY_S:
                    log.warning("run %s: %s", run_id, exc)
                    last_warned = time.monotonic()
            else:
                if job.terminal:
                    return run_finish_from_job(run=run, job=job, log_text=text)
                # The job exists and answers: that is the supervisor's heartbeat (the engine sends its own).
                run_heartbeat(run_id=run_id)
            if not lease_renew(run_id=run_id, owner=owner):
                return "lease lost"
            time.sleep(poll_s())
    finally:
        if tail is not None:
            tail.close()


def cancel_grace_s(run: Run) -> float:
    """How long a cancel waits for the job to stop after SIGTERM: what the engine said a graceful stop of
    this run needs (``Run.stop_grace_s``), at least ``RUN_CANCEL_GRACE_S``, at most the operator's
    ``RUN_CANCEL_GRACE_MAX_S`` (also the local head's RAY_JOB_STOP_WAIT_TIME_S, Ray's hard stop)."""
    floor = float(setting("RUN_CANCEL_GRACE_S", 5))
    cap = max(floor, float(setting("RUN_CANCEL_GRACE_MAX_S", 300)))
    return min(cap, max(floor, run.stop_grace_s or 0.0))


def cancel_kept(run_id: int) -> str:
    """What a stopped run kept, in words for its page and events: its latest checkpoint on disk."""
    ckpt = Checkpoint.objects.filter(run_id=run_id, pruned_at=None).order_by("-step").first()
    return f"checkpoint at step {ckpt.step} kept" if ckpt else "no checkpoint kept"


def cancel(*, run_id: int) -> str:
    """Graceful stop (SIGTERM: the engine leaves its step at the next micro-batch, checkpoints the last
    completed step and exits) within ``cancel_grace_s``; → cancelled, with an event saying what the run
    kept. Ray kills the driver after RAY_JOB_STOP_WAIT_TIME_S. Idempotent."""
    run = Run.objects.get(pk=run_id)
    if run.state == RunState.QUEUED:
        _try(run_id, RunState.CANCELLED, {RunState.QUEUED}, error="cancelled before it started")
    elif run.state in (RunState.STARTING, RunState.RUNNING):
        _try(run_id, RunState.CANCELLING, {RunState.STARTING, RunState.RUNNING})
    run = Run.objects.get(pk=run_id)
    if run.state != RunState.CANCELLING:
        return run.state
    error = ""
    if run.ray_job_id and run.cluster_address:
        grace = cancel_grace_s(run)
        try:
            jobs.stop(run.cluster_address, run.ray_job_id)
            if jobs.wait_terminal(run.cluster_address, run.ray_job_id, timeout=grace + 3.0) is None:
                error = f"the Ray job did not stop within {grace + 3.0:.0f} s; Ray kills it"
        except jobs.JobNotFound:
            pass  # never submitted (cancelled while starting) or already cleaned up
        except jobs.ClusterUnreachable as exc:
            error = f"could not reach the cluster to stop the job: {exc}"
    _try(run_id, RunState.CANCELLED, {RunState.CANCELLING}, error=error)
    run = Run.objects.get(pk=run_id)
    if run.state == RunState.CANCELLED and run.ray_job_id:
        kept = cancel_kept(run_id)
        events_append_many(
            run_id=run_id,
            events=[NewEvent(EventKind.LOG, f"cancelled: {kept}", {"source": "launcher", "kept": kept})],
        )
    return run.state


def _try(run_id: int, to: str, from_states: set[str], error: str = "") -> None:
    try:
        fields = {"cancel_requested_at": timezone.now()} if to == RunState.CANCELLING else {}
        run_transition(run_id=run_id, to=to, from_states=from_states, error=error, **fields)
    except InvalidTransition:
        pass


@dataclass
class SweepResult:
    reaped: list[int] = field(default_factory=list)  # silent or stalled: failed
    to_start: list[int] = field(default_factory=list)  # starting runs nobody is launching
    to_supervise: list[int] = field(default_factory=list)  # running/cancelling runs nobody follows


def reap_silent() -> list[int]:
    """Runs whose heartbeat is older than RUN_HEARTBEAT_TIMEOUT_S become ``failed`` with the reason."""
    timeout = int(setting("RUN_HEARTBEAT_TIMEOUT_S", 120))
    cutoff = timezone.now() - timedelta(seconds=timeout)
    silent = Run.objects.filter(state__in=(RunState.RUNNING, RunState.CANCELLING)).filter(
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)
    )
    reaped = []
    for run in silent:
        reason = (f"no heartbeat for over {timeout} s: neither the engine nor its supervisor reported "
                  f"(last heartbeat {run.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC)" if run.heartbeat_at
                  else f"no heartbeat within {timeout} s of the start")  # fmt: skip
        try:
            run_transition(run_id=run.pk, to=RunState.FAILED, from_states=set(BUSY_STATES), error=reason)
        except InvalidTransition:
            continue
        job_stop_quietly(run)  # a silent job must not keep holding the cluster
        reaped.append(run.pk)
    return reaped


def reap_stalled() -> list[int]:
    """Running runs whose engine made no progress (no new step stored, no status or checkpoint reported)
    for RUN_STALL_TIMEOUT_S become ``failed`` with that reason, and their job is stopped. The heartbeat
    cannot tell: a deadlocked engine's sink and its supervisor keep heartbeating while the job exists."""
    timeout = int(setting("RUN_STALL_TIMEOUT_S", 1800))
    if timeout <= 0:
        return []
    cutoff = timezone.now() - timedelta(seconds=timeout)
    stalled = Run.objects.filter(state=RunState.RUNNING).filter(
        Q(progress__at__lt=cutoff) | Q(progress__isnull=True, started_at__lt=cutoff)
    )
    reaped = []
    for run in stalled.select_related("progress"):
        progress = getattr(run, "progress", None)
        last = "none since it started"
        if progress is not None:
            step = f"step {progress.step}, " if progress.step is not None else ""
            last = f"last: {step}{progress.at:%Y-%m-%d %H:%M:%S} UTC"
        reason = f"the engine made no progress for over {timeout} s ({last}): stopped (RUN_STALL_TIMEOUT_S)"
        try:
            run_transition(run_id=run.pk, to=RunState.FAILED, from_states={RunState.RUNNING}, error=reason)
        except InvalidTransition:
            continue
        job_stop_quietly(run)  # a hung engine must not keep holding the cluster
        reaped.append(run.pk)
    return reaped


def find_orphans() -> tuple[list[int], list[int]]:
    """Busy runs whose lease expired (their task died): reserve them and say what to enqueue."""
    now = timezone.now()
    busy = Run.objects.filter(state__in=BUSY_STATES)
    for run_id in busy.filter(supervision__isnull=True).values_list("id", flat=True):
        # Created already expired: nobody holds a run that has no supervision row.
        Supervision.objects.get_or_create(run_id=run_id, defaults={"lease_until": now - timedelta(seconds=1)})
    to_start: list[int] = []
    to_supervise: list[int] = []
    expired = Supervision.objects.filter(run__state__in=BUSY_STATES, lease_until__lt=now)
    for run_id, state in expired.values_list("run_id", "run__state"):
        reserved = Supervision.objects.filter(run_id=run_id, lease_until__lt=now).update(
            owner="", lease_until=now + timedelta(seconds=RESERVE_S)
        )
        if reserved:
            (to_start if state == RunState.STARTING else to_supervise).append(run_id)
    return to_start, to_supervise


def sweep() -> SweepResult:
    reaped = reap_silent() + reap_stalled()
    to_start, to_supervise = find_orphans()
    return SweepResult(reaped=reaped, to_start=to_start, to_supervise=to_supervise)

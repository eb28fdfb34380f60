"""Launcher business rules: admission (concurrency + priority), launch, leases, finishing, reaping.

Every state change goes through :func:`experiments.services.run_transition` (compare-and-set). The
Celery tasks in ``tasks.py`` only parse ids and call these functions.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from accounts.services import ingest_token_issue
from experiments import run_files
from experiments.config_policy import check_config
from experiments.models import Run, RunState
from experiments.selectors import stored_config
from experiments.services import InvalidTransition, run_transition
from launcher import job_env as job_env_module
from launcher import jobs
from launcher.models import LauncherLock, Supervision
from launcher.placement import run_placement
from rl_engine.config import ConfigError
from rl_engine.jobspec import IngestSpec, JobSpec
from rl_engine.wire import EventKind
from tracking.services import events_append

log = logging.getLogger(__name__)

BUSY_STATES = (RunState.STARTING, RunState.RUNNING, RunState.CANCELLING)
# A launch may wait for a local head to boot (up to ~90 s): its lease must outlast that.
LAUNCH_LEASE_S = 180


def setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


def lease_s() -> int:
    return int(setting("LAUNCHER_LEASE_S", 15))


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


# --- admission -------------------------------------------------------------------------------------------


def _lock_admission() -> None:
    LauncherLock.objects.get_or_create(name="admission")
    LauncherLock.objects.select_for_update().get(name="admission")


def runs_admit() -> list[int]:
    """Move queued runs to ``starting`` in priority order while the limits allow; returns their ids.

    Global limit RUN_CONCURRENCY_LIMIT and per-project RUN_CONCURRENCY_LIMIT_PER_PROJECT (0: none) count
    runs in starting/running/cancelling. A project at its cap does not block other projects' runs; nor
    does a sweep at its own cap (``Sweep.max_concurrent`` of its runs busy) block other runs.
    """
    global_cap = int(setting("RUN_CONCURRENCY_LIMIT", 2))
    project_cap = int(setting("RUN_CONCURRENCY_LIMIT_PER_PROJECT", 0))
    admitted: list[int] = []
    with transaction.atomic():
        _lock_admission()
        busy = Run.objects.filter(state__in=BUSY_STATES)
        free = global_cap - busy.count() if global_cap > 0 else 1 << 30
        if free <= 0:
            return []
        per_project = dict(busy.values_list("project_id").annotate(n=Count("id")))
        per_sweep = dict(
            busy.filter(sweep_member__isnull=False)
            .values_list("sweep_member__sweep_id")
            .annotate(n=Count("id"))
        )
        queue = Run.objects.filter(state=RunState.QUEUED).order_by("-priority", "created_at", "id")
        rows = queue.values_list(
            "id", "project_id", "sweep_member__sweep_id", "sweep_member__sweep__max_concurrent"
        )
        for run_id, project_id, sweep_id, sweep_cap in rows[:500]:
            if free <= 0:
                break
            if project_cap > 0 and per_project.get(project_id, 0) >= project_cap:
                continue
            if sweep_id is not None and per_sweep.get(sweep_id, 0) >= sweep_cap:
                continue
            try:
                run_transition(run_id=run_id, to=RunState.STARTING, from_states={RunState.QUEUED})
            except InvalidTransition:  # cancelled meanwhile
                continue
            # Reserve the launch for whichever task picks the run up next (see lease_acquire).
            Supervision.objects.update_or_create(
                run_id=run_id,
                defaults={"owner": "", "lease_until": timezone.now() + timedelta(seconds=LAUNCH_LEASE_S)},
            )
            admitted.append(run_id)
            per_project[project_id] = per_project.get(project_id, 0) + 1
            if sweep_id is not None:
                per_sweep[sweep_id] = per_sweep.get(sweep_id, 0) + 1
            free -= 1
    return admitted


# --- leases ---------------------------------------------------------------------------------------------


def lease_acquire(*, run_id: int, owner: str, seconds: int) -> bool:
    """Take the run for ``owner`` if it is unowned, expired, or already ours (idempotent)."""
    now = timezone.now()
    Supervision.objects.get_or_create(run_id=run_id, defaults={"lease_until": now})
    taken = Supervision.objects.filter(
        Q(owner="") | Q(lease_until__lt=now) | Q(owner=owner), run_id=run_id
    ).update(owner=owner, lease_until=now + timedelta(seconds=seconds))
    if taken:
        Supervision.objects.filter(run_id=run_id).update(attaches=F("attaches") + 1)
    return bool(taken)


def lease_renew(*, run_id: int, owner: str, seconds: int | None = None) -> bool:
    """False when someone else took the run (we must stop supervising it)."""
    until = timezone.now() + timedelta(seconds=seconds or lease_s())
    return bool(Supervision.objects.filter(run_id=run_id, owner=owner).update(lease_until=until))


def lease_release(*, run_id: int, owner: str, reserve_s: int = 0) -> None:
    """Give the run up; ``reserve_s`` keeps it for the next task enqueued for it for that long."""
    until = timezone.now() + timedelta(seconds=reserve_s)
    Supervision.objects.filter(run_id=run_id, owner=owner).update(owner="", lease_until=until)


# --- launch ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    provider: str
    address: str  # the dashboard URL the Jobs API answers on


class LaunchError(RuntimeError):
    """The run cannot be launched; the message goes to Run.error."""


def cluster_for(run: Run) -> Cluster:
    """Reach (and for ``local``, start if needed) the cluster the run asked for."""
    provider = run.provider or setting("RAY_PROVIDER", "local")
    if provider == "local":
        from launcher import ray_local

        try:
            return Cluster("local", ray_local.ensure_started().dashboard_url)
        except ray_local.LocalHeadError as exc:
            raise LaunchError(str(exc)) from exc
    if provider == "address":
        address = run.cluster_address or setting("RAY_ADDRESS", "")
        if not address:
            raise LaunchError(
                "provider 'address' needs RAY_ADDRESS (the cluster's dashboard URL, e.g. http://head:8265)"
            )
        if "://" not in address:
            address = f"http://{address}"
        return Cluster("address", address.rstrip("/"))
    raise LaunchError(f"unknown provider {provider!r}: use 'local' or 'address'")


def submission_id_for(run: Run) -> str:
    """Deterministic per run *row* (see experiments.run_files.submission_id)."""
    return run_files.submission_id(run)


def run_dir(run: Run) -> Path:
    """The run's files (frozen config, checkpoints, the sink's spool, the ingest token), named by its
    submission id: a run id alone repeats after a database reset, and a new run must not inherit an
    old run's files. Readable by the job's user only."""
    path = run_files.run_folder(run)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def job_spec(run: Run, token_file: Path) -> JobSpec:
    """What the engine gets for ``run`` (rl_engine.jobspec), built here once: the run's frozen config as
    the user gave it (read back typed), where it runs (launcher.placement) and where its ``http`` sink
    reports. ConfigError when the stored config is no longer valid, or no longer permitted: the policy is
    checked again as it stands now (an administrator may have withdrawn ``allow_trust_remote_code`` or
    narrowed ``ALLOWED_MODELS`` while the run was queued), naming the refused field."""
    config = stored_config(run)
    check_config(config, project=run.project)
    folder = run_dir(run)
    timeout_s = int(setting("RUN_HEARTBEAT_TIMEOUT_S", 120))
    ingest = IngestSpec(
        url=setting("PLATFORM_URL", "http://127.0.0.1:8000"),
        run_id=str(run.pk),
        token_file=str(token_file),
        spool_dir=str(folder / "spool"),
        # Several heartbeats per reaper timeout, so one late post never gets a healthy run reaped.
        heartbeat_s=max(1.0, min(10.0, timeout_s / 4)),
    )
    return JobSpec(config=config, placement=run_placement(run, config), ingest=ingest)


def job_spec_file(spec: JobSpec, run: Run) -> Path:
    """Write the spec the job runs with (``spec.spec_document()``: config and placement) into the run's
    folder."""
    path = run_dir(run) / "job.yaml"
    path.write_text(yaml.safe_dump(spec.spec_document(), sort_keys=False))
    return path


def engine_entrypoint(spec_path: Path) -> str:
    python = setting("ENGINE_PYTHON", "") or sys.executable  # absolute: the head's PATH is not ours
    workdir = str(setting("ENGINE_WORKDIR", "") or settings.BASE_DIR)
    return (
        f"cd {shlex.quote(workdir)} && exec {shlex.quote(python)} -m rl_engine train "
        f"--config {shlex.quote(str(spec_path))}"
    )


def ingest_token_file(run: Run, token_secret: str) -> Path:
    """The ingest token for the engine, in a file only the job's user can read: the job's environment
    is shown by the Ray dashboard to anyone who can open it, so the secret must not travel there."""
    path = run_dir(run) / "ingest-token"
    tmp = path.with_name(f".ingest-token.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token_secret)
    tmp.replace(path)  # atomic: a re-issued token never leaves a half-written file
    return path


def job_env(spec: JobSpec) -> dict[str, str]:
    """The Ray job's environment: an allow-list (launcher.job_env), the spec's (where the engine's sink
    reports) and nothing of the platform's own settings."""
    return job_env_module.job_env(spec.env())


def base_job_env() -> dict[str, str]:
    """The environment of a job that reports nothing (an export)."""
    return job_env_module.job_env()


def engine_env(run: Run, token_secret: str) -> dict[str, str]:
    """The job's environment for ``run``, its ingest token written to the run's private file."""
    return job_env(job_spec(run, ingest_token_file(run, token_secret)))


def run_launch(*, run_id: int, owner: str) -> str:
    """Submit the job of a ``starting`` run (or find the one an earlier attempt submitted); → running.

    Returns the resulting run state. Raises nothing for expected failures: they become ``failed``.
    """
    run = Run.objects.select_related("resumed_from_checkpoint").get(pk=run_id)
    if run.state != RunState.STARTING:
        return run.state
    # (cluster, job id) once a submission was sent: Ray may hold the job even when the call failed.
    submitted: tuple[str, str] | None = None
    try:
        cluster = cluster_for(run)
        sid = run.ray_job_id or submission_id_for(run)
        # Recorded before submitting: if we die in between, the next attempt looks for this id first.
        Run.objects.filter(pk=run_id).update(
            ray_job_id=sid, cluster_address=cluster.address, provider=cluster.provider
        )
        try:
            jobs.state(cluster.address, sid)
            events_append(
                run_id=run_id,
                kind=EventKind.LOG,
                message=f"re-attached to existing Ray job {sid}",
                data={"source": "launcher"},
            )
        except jobs.JobNotFound:
            token = ingest_token_issue(run=run)
            spec = job_spec(run, ingest_token_file(run, token.secret))
            entry = engine_entrypoint(job_spec_file(spec, run))
            submitted = (cluster.address, sid)
            jobs.submit(cluster.address, submission_id=sid, entrypoint=entry, env=job_env(spec),
                        metadata={"platform_run_id": spec.run_id})  # fmt: skip
            events_append(run_id=run_id, kind=EventKind.LOG, message=f"submitted Ray job {sid} to {cluster.address}",
                          data={"source": "launcher", "entrypoint": entry})  # fmt: skip
    except (LaunchError, ConfigError, jobs.ClusterUnreachable) as exc:
        # The run fails (a ConfigError: its stored config is no longer valid); a job Ray accepted anyway
        # (the reply was lost) must not train on unsupervised.
        # (Any other error leaves the run starting: the sweep retries the launch and re-attaches.)
        _stop_submitted(submitted, run_id)
        _finish(run_id, RunState.FAILED, error=f"launch failed: {exc}", from_states={RunState.STARTING})
        return RunState.FAILED
    try:
        run_transition(run_id=run_id, to=RunState.RUNNING, from_states={RunState.STARTING},
                       heartbeat_at=timezone.now())  # fmt: skip
    except InvalidTransition:
        # Cancelled while we were submitting: the job must not outlive the run.
        run = Run.objects.get(pk=run_id)
        job_stop_quietly(run)
        if run.state == RunState.CANCELLING:
            _finish(run_id, RunState.CANCELLED, from_states={RunState.CANCELLING})
        return Run.objects.get(pk=run_id).state
    return RunState.RUNNING


def _stop_submitted(submitted: tuple[str, str] | None, run_id: int) -> None:
    """Stop the job of a launch that failed after (or while) submitting it."""
    if submitted is None:
        return
    address, sid = submitted
    try:
        if jobs.stop(address, sid):
            log.warning("run %s: launch failed after Ray accepted job %s; stopped it", run_id, sid)
    except (jobs.JobNotFound, jobs.ClusterUnreachable) as exc:
        log.info("run %s: stop of job %s after a failed launch: %s", run_id, sid, exc)


def job_stop_quietly(run: Run) -> None:
    if run.ray_job_id and run.cluster_address:
        try:
            jobs.stop(run.cluster_address, run.ray_job_id)
        except (jobs.JobNotFound, jobs.ClusterUnreachable) as exc:
            log.info("stop of job %s: %s", run.ray_job_id, exc)


def _finish(run_id: int, to: str, *, error: str = "", from_states: set[str] | None = None) -> bool:
    try:
        run_transition(run_id=run_id, to=to, error=error, from_states=from_states)
    except InvalidTransition:
        return False
    return True


def run_finish_from_job(*, run: Run, job: jobs.JobState | None, log_text: str, reason: str = "") -> str:
    """Terminal state of a run whose job ended (``job``) or vanished (``job`` None, ``reason`` says why)."""
    if run.state == RunState.CANCELLING:
        _finish(run.pk, RunState.CANCELLED, from_states={RunState.CANCELLING})
    elif job is None:
        _finish(run.pk, RunState.FAILED, error=reason)
    elif job.status == "SUCCEEDED":
        _finish(run.pk, RunState.SUCCEEDED, from_states={RunState.RUNNING})
    elif job.status == "STOPPED":
        _finish(run.pk, RunState.FAILED, error="the Ray job was stopped outside the platform")
    else:
        error = jobs.error_from_logs(log_text, fallback=job.message) or f"the job failed ({job.message})"
        _finish(run.pk, RunState.FAILED, error=error)
    return Run.objects.get(pk=run.pk).state

"""Checkpoint export: a run's checkpoint -> a standard Hugging Face model directory, as a launcher task.

The export runs where the checkpoint is: ``python -m rl_engine export`` is submitted as a Ray Job to
the run's cluster (like the run itself), into ``<checkpoint dir>/hf/<step dir>`` (outside the
``step_*`` names that checkpoint pruning deletes). Its progress is recorded as run events (kind
``log``, ``data.source == "export"``: queued -> running -> succeeded | failed, with the output path or
the engine's error), so it reaches the run page live and needs no table of its own; the latest event
per step is the export's state (``exports_for_run``).
"""

from __future__ import annotations

import functools
import json
import logging
import shlex
import sys
from pathlib import PurePosixPath
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction

from experiments.models import Run
from launcher import jobs, services
from tracking.models import Checkpoint, EventKind, RunEvent
from tracking.services import events_append

log = logging.getLogger(__name__)

SOURCE = "export"
ACTIVE = ("queued", "running")
EXPORT_TIMEOUT_S = 3600  # a 70B model in bfloat16 is ~140 GB to read and write


class ExportNotFound(LookupError):
    """The run has no checkpoint at that step."""


def export_dir_for(checkpoint_path: str) -> str:
    p = PurePosixPath(checkpoint_path)
    return str(p.parent / "hf" / p.name)


# --- selectors ----------------------------------------------------------------------------------------


def exports_for_run(run_id: int) -> dict[int, dict[str, Any]]:
    """{step: the latest export record} from the run's export events (``seq`` of the request included)."""
    out: dict[int, dict[str, Any]] = {}
    events = RunEvent.objects.filter(run_id=run_id, kind=EventKind.LOG, data__source=SOURCE).order_by("seq")
    for ev in events:
        data = dict(ev.data)
        step = int(data["step"])
        if data["state"] == "queued":  # a new request: its event's seq names it (and its Ray job)
            out[step] = {"request_seq": ev.seq, "requested": ev.created.isoformat(), "error": ""}
        out[step] = {**out.get(step, {}), **data, "updated": ev.created.isoformat()}
    return out


# --- services -----------------------------------------------------------------------------------------


def _record(run_id: int, step: int, state: str, message: str, **data: Any) -> RunEvent:
    return events_append(
        run_id=run_id,
        kind=EventKind.LOG,
        message=message,
        data={"source": SOURCE, "step": step, "state": state, **data},
    )


def _enqueue(run_id: int, step: int, request_seq: int) -> None:
    try:
        export_checkpoint.delay(run_id, step, request_seq)
    except Exception:  # the request is recorded; a broker outage shows as an export stuck in "queued"
        log.exception("could not enqueue the export of run %s step %s", run_id, step)


def export_request(*, run: Run, step: int, username: str) -> dict[str, Any]:
    """Queue the export of the run's checkpoint at ``step`` (idempotent while one is queued or running)."""
    ckpt = Checkpoint.objects.filter(run=run, step=step).first()
    if ckpt is None:
        raise ExportNotFound(f"run {run.pk} has no checkpoint at step {step}")
    current = exports_for_run(run.pk).get(step)
    if current is not None and current["state"] in ACTIVE:
        return current
    with transaction.atomic():
        ev = _record(run.pk, step, "queued", f"export of the step {step} checkpoint queued",
                     checkpoint=ckpt.path, out=export_dir_for(ckpt.path), by=username)  # fmt: skip
        transaction.on_commit(functools.partial(_enqueue, run.pk, step, ev.seq))
    return exports_for_run(run.pk)[step]


def _entrypoint(checkpoint: str, out: str) -> str:
    python = services.setting("ENGINE_PYTHON", "") or sys.executable
    workdir = str(services.setting("ENGINE_WORKDIR", "") or settings.BASE_DIR)
    return (
        f"cd {shlex.quote(workdir)} && exec {shlex.quote(python)} -m rl_engine export "
        f"--checkpoint {shlex.quote(checkpoint)} --out {shlex.quote(out)} --force"
    )


def _result_line(log_text: str) -> dict[str, Any] | None:
    """The export command's last stdout line: one JSON object (out, checkpoint, step, dtype, size_bytes)."""
    for line in reversed(log_text.splitlines()):
        line = jobs.clean_log_line(line).strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def export_run(*, run_id: int, step: int, request_seq: int) -> str:
    """Run one export request to its end (called by the task; safe to call again after a worker death:
    the Ray Job's submission id is fixed per request, so a redelivery follows the same job)."""
    current = exports_for_run(run_id).get(step)
    if current is None or current.get("request_seq") != request_seq:
        return "superseded"
    if current["state"] not in ACTIVE:
        return current["state"]
    run = Run.objects.get(pk=run_id)
    checkpoint, out = current["checkpoint"], current["out"]
    sid = f"{services.submission_id_for(run)}-export-{step}-{request_seq}"
    try:
        cluster = services.cluster_for(run)
        workdir = str(services.setting("ENGINE_WORKDIR", "") or settings.BASE_DIR)
        jobs.submit(cluster.address, submission_id=sid, entrypoint=_entrypoint(checkpoint, out),
                    env={"PYTHONPATH": workdir, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"},
                    metadata={"run_id": str(run_id), "kind": "export", "step": str(step)})  # fmt: skip
        if current["state"] == "queued":
            _record(
                run_id, step, "running", f"exporting the step {step} checkpoint (Ray job {sid})", job_id=sid
            )
        final = jobs.wait_terminal(cluster.address, sid, timeout=EXPORT_TIMEOUT_S, poll_s=1.0)
        log_text = jobs.logs(cluster.address, sid)
    except (services.LaunchError, jobs.ClusterUnreachable, jobs.JobNotFound) as exc:
        _record(run_id, step, "failed", f"export of step {step} failed: {exc}", error=str(exc))
        return "failed"
    result = _result_line(log_text) if final is not None and final.status == "SUCCEEDED" else None
    if result is None:
        reason = "timed out" if final is None else final.message
        error = jobs.error_from_logs(log_text, fallback=reason) or reason
        _record(
            run_id, step, "failed", f"export of step {step} failed: {error.splitlines()[-1]}", error=error
        )
        return "failed"
    _record(run_id, step, "succeeded", f"exported step {step} to {result['out']}",
            out=result["out"], size_bytes=int(result.get("size_bytes", 0)), dtype=result.get("dtype", ""))  # fmt: skip
    return "succeeded"


@shared_task(name="launcher.export_checkpoint", acks_late=True)
def export_checkpoint(run_id: int, step: int, request_seq: int) -> str:
    """Export one checkpoint as a Ray Job on the run's cluster; the outcome is a run event."""
    return export_run(run_id=run_id, step=step, request_seq=request_seq)

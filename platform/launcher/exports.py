"""Checkpoint export: a run's checkpoint -> a standard Hugging Face model directory, as a launcher task.

The export runs where the checkpoint is: ``python -m rl_engine export`` is submitted as a Ray Job to
the run's cluster (like the run itself), into ``<run's checkpoint folder>/hf/step_<step>`` (outside the
names that checkpoint pruning deletes). Its state is the :class:`launcher.models.Export` row, written
by the platform only (queued -> running -> succeeded | failed): the request names the
:class:`tracking.models.Checkpoint` row, the task reads the checkpoint's path from that row and
computes the output folder itself, both checked to lie in the run's own folder (real paths). Run
events (kind ``log``, ``data.source == "export"``) announce each change to the run page; they are
never read back, and reported events may not use that source (rl_engine.wire.RESERVED_SOURCES).
"""

from __future__ import annotations

import functools
import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import IntegrityError, transaction

from experiments import run_files
from experiments.models import Run
from launcher import jobs, services
from launcher.models import Export, ExportState
from rl_engine.wire import EventKind
from tracking.models import Checkpoint
from tracking.services import events_append

log = logging.getLogger(__name__)

SOURCE = "export"
ACTIVE = (ExportState.QUEUED, ExportState.RUNNING)
EXPORT_TIMEOUT_S = 3600  # a 70B model in bfloat16 is ~140 GB to read and write


class ExportNotFound(LookupError):
    """The run has no checkpoint at that step."""


class ExportRefused(ValueError):
    """The checkpoint's path (or the export's folder) leaves the run's own folder."""


def export_dir_for(run: Run, step: int) -> Path:
    """Where the export of ``run``'s step ``step`` goes: chosen by the platform, inside the run's own
    checkpoint folder (never from anything reported)."""
    return run_files.checkpoint_folder(run) / "hf" / f"step_{step:08d}"


def _paths_refused(run: Run, checkpoint: str, out: Path) -> str:
    """Why the job may not read ``checkpoint`` or replace ``out`` ('' when both lie in the run's own
    folder, symlinks followed): rows written before the ingestion check, or a link the job made."""
    folder = run_files.checkpoint_folder(run)
    if not run_files.is_inside(checkpoint, folder):
        return f"the checkpoint {checkpoint} lies outside the run's checkpoint folder {folder}"
    if not run_files.is_inside(out, folder):
        return f"the export folder {out} leads outside the run's checkpoint folder {folder}"
    return ""


# --- selectors ----------------------------------------------------------------------------------------


def export_record(export: Export) -> dict[str, Any]:
    """The API's view of one export."""
    return {
        "id": export.pk,
        "step": export.step,
        "state": export.state,
        "checkpoint": export.checkpoint.path,
        "out": export.out,
        "error": export.error,
        "size_bytes": export.size_bytes,
        "dtype": export.dtype,
        "job_id": export.job_id,
        "by": export.requested_by,
        "requested": export.requested_at,
        "updated": export.updated_at,
    }


def exports_for_run(run_id: int) -> dict[int, dict[str, Any]]:
    """{step: the latest export request of that step}, from the platform's table."""
    out: dict[int, dict[str, Any]] = {}
    for export in Export.objects.filter(run_id=run_id).select_related("checkpoint").order_by("step", "id"):
        out[export.step] = export_record(export)
    return out


# --- services -----------------------------------------------------------------------------------------


def _announce(export: Export, message: str) -> None:
    """A notice on the run's event stream for the live page (never read back)."""
    events_append(run_id=export.run_id, kind=EventKind.LOG, message=message,
                  data={"source": SOURCE, "export_id": export.pk, "step": export.step, "state": export.state})  # fmt: skip


def export_transition(export: Export, state: str, message: str, **fields: Any) -> None:
    """Move ``export`` to ``state`` (with its result fields) and announce it on the run's events."""
    with transaction.atomic():
        for name, value in {"state": state, **fields}.items():
            setattr(export, name, value)
        export.save()
        _announce(export, message)


def _enqueue(export_id: int) -> None:
    try:
        export_checkpoint.delay(export_id)
    except Exception:  # the request is recorded; a broker outage shows as an export stuck in "queued"
        log.exception("could not enqueue export %s", export_id)


def export_request(*, run: Run, step: int, username: str) -> dict[str, Any]:
    """Queue the export of the run's checkpoint at ``step`` (idempotent while one is queued or running).
    Raises ExportNotFound without such a checkpoint, ExportRefused when its path leaves the run's folder."""
    ckpt = Checkpoint.objects.filter(run=run, step=step).first()
    if ckpt is None:
        raise ExportNotFound(f"run {run.pk} has no checkpoint at step {step}")
    if ckpt.pruned_at is not None:
        raise ExportRefused(
            f"the checkpoint at step {step} was removed by the engine (trainer.keep_checkpoints): "
            f"nothing to export"
        )
    out = export_dir_for(run, step)
    if reason := _paths_refused(run, ckpt.path, out):
        raise ExportRefused(reason)
    active = Export.objects.filter(run=run, step=step, state__in=ACTIVE).select_related("checkpoint").first()
    if active is not None:
        return export_record(active)
    try:
        with transaction.atomic():
            export = Export.objects.create(
                run=run, checkpoint=ckpt, step=step, out=str(out), requested_by=username
            )
            _announce(export, f"export of the step {step} checkpoint queued")
            transaction.on_commit(functools.partial(_enqueue, export.pk))
    except IntegrityError:  # a concurrent request won: answer with it
        export = Export.objects.select_related("checkpoint").get(run=run, step=step, state__in=ACTIVE)
    return export_record(export)


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
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def export_run(*, export_id: int) -> str:
    """Run one export request to its end (called by the task; safe to call again after a worker death:
    the Ray Job's submission id is fixed per request, so a redelivery follows the same job)."""
    export = Export.objects.select_related("checkpoint", "run").filter(pk=export_id).first()
    if export is None:
        return "superseded"
    if export.state not in ACTIVE:
        return export.state
    run, step = export.run, export.step
    checkpoint, out = export.checkpoint.path, export.out
    if reason := _paths_refused(run, checkpoint, Path(out)):  # again: the disk may have changed since
        export_transition(
            export, ExportState.FAILED, f"export of step {step} refused: {reason}", error=reason
        )
        return ExportState.FAILED
    sid = f"{services.submission_id_for(run)}-export-{step}-{export.pk}"
    try:
        cluster = services.cluster_for(run)
        jobs.submit(cluster.address, submission_id=sid, entrypoint=_entrypoint(checkpoint, out),
                    env=services.base_job_env(),
                    metadata={"run_id": str(run.pk), "kind": "export", "step": str(step)})  # fmt: skip
        if export.state == ExportState.QUEUED:
            export_transition(export, ExportState.RUNNING, f"exporting the step {step} checkpoint (Ray job {sid})",
                       job_id=sid)  # fmt: skip
        final = jobs.wait_terminal(cluster.address, sid, timeout=EXPORT_TIMEOUT_S, poll_s=1.0)
        log_text = jobs.logs(cluster.address, sid)
    except (services.LaunchError, jobs.ClusterUnreachable, jobs.JobNotFound) as exc:
        export_transition(export, ExportState.FAILED, f"export of step {step} failed: {exc}", error=str(exc))
        return ExportState.FAILED
    result = _result_line(log_text) if final is not None and final.status == "SUCCEEDED" else None
    if result is None:
        reason = "timed out" if final is None else final.message
        error = jobs.error_from_logs(log_text, fallback=reason) or reason
        export_transition(export, ExportState.FAILED, f"export of step {step} failed: {error.splitlines()[-1]}",
                   error=error)  # fmt: skip
        return ExportState.FAILED
    # Only sizes come from the job's output: the folder is the one the platform chose.
    dtype = result.get("dtype")
    export_transition(export, ExportState.SUCCEEDED, f"exported step {step} to {out}",
               size_bytes=_int_or_none(result.get("size_bytes")),
               dtype=dtype[:32] if isinstance(dtype, str) else "")  # fmt: skip
    return ExportState.SUCCEEDED


@shared_task(name="launcher.export_checkpoint", acks_late=True)
def export_checkpoint(export_id: int) -> str:
    """Export one checkpoint as a Ray Job on the run's cluster; the outcome is the Export row."""
    return export_run(export_id=export_id)

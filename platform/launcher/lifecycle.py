"""The launcher owns enqueueing its tasks: a run announced queued or cancel-requested
(experiments.lifecycle) gets its ``start_run`` / ``cancel_run`` task once the transaction commits (a
worker would not find an uncommitted run). Connected in LauncherConfig.ready."""

from __future__ import annotations

import functools
import logging
from typing import Any

from django.db import transaction
from django.dispatch import receiver

from experiments.lifecycle import CancelRequested, RunQueued, cancel_requested, run_queued
from experiments.models import Run
from launcher.tasks import cancel_run, start_run

log = logging.getLogger(__name__)


def enqueue_start(run_id: int) -> None:
    """Send the run's start task. A broker that does not answer leaves the run queued (logged): the
    sweep's admission starts it later. One try, bounded by the broker's socket timeout
    (``REDIS_SOCKET_TIMEOUT_S``): a silent Redis must not hold the request that launched the run."""
    try:
        result = start_run.apply_async((run_id,), retry=False)
    except Exception:
        log.exception("could not enqueue start of run %s", run_id)
        return
    task_id = getattr(result, "id", "") or ""
    if task_id:
        Run.objects.filter(pk=run_id, celery_task_id="").update(celery_task_id=task_id)


def enqueue_cancel(run_id: int) -> None:
    """Send the run's cancel task. Without a broker the run stays cancelling: its supervisor stops the job."""
    try:
        cancel_run.apply_async((run_id,), retry=False)  # one bounded try, as enqueue_start
    except Exception:
        log.exception("could not enqueue cancel of run %s", run_id)


@receiver(run_queued, dispatch_uid="launcher.start_on_commit")
def start_on_commit(sender: type, message: RunQueued, **kwargs: Any) -> None:
    transaction.on_commit(functools.partial(enqueue_start, message.run_id))


@receiver(cancel_requested, dispatch_uid="launcher.cancel_on_commit")
def cancel_on_commit(sender: type, message: CancelRequested, **kwargs: Any) -> None:
    transaction.on_commit(functools.partial(enqueue_cancel, message.run_id))

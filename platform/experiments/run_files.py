"""Where a run's files live: its own folder under ``VAR_DIR/runs``, named by its Ray submission id.

The folder holds the job spec the job runs with, the checkpoints, the JSONL log and the trackers' local
files (when asked for), the HTTP sink's spool and the ingest-token file. Nothing outside it is written
for a run (the launcher's placement, launcher.placement, names this folder as the run's), and the path
policy (experiments.config_policy) accepts checkpoints to resume from only inside it.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from experiments.models import Run
from rl_engine.jobspec import JSONL_NAME

CHECKPOINTS = "checkpoints"


def submission_id(run: Run) -> str:
    """Deterministic per run *row*: a re-attempted start finds its job instead of starting a second one.
    The creation time keeps ids unique if the database is reset while a cluster keeps old jobs (and a
    new run never inherits an old run's folder)."""
    return f"rlp-run-{run.pk}-{int(run.created_at.timestamp() * 1000)}"


def run_folder(run: Run) -> Path:
    """The run's folder (not created here)."""
    return Path(settings.VAR_DIR) / "runs" / submission_id(run)


def checkpoint_folder(run: Run) -> Path:
    return run_folder(run) / CHECKPOINTS


def jsonl_log(run: Run) -> Path:
    """The engine's JSONL log of a run whose config lists the ``jsonl`` sink (in its run folder)."""
    return run_folder(run) / JSONL_NAME


def is_inside(path: str | Path, root: Path) -> bool:
    """``path`` (absolute, after removing ``..``) lies in ``root``; where it exists on this machine its
    real path (symlinks followed) must lie in the real ``root`` too."""
    text = str(path)
    if not text or "\x00" in text or not os.path.isabs(text):
        return False
    lexical = Path(os.path.normpath(text))
    if not lexical.is_relative_to(root):
        return False
    return Path(os.path.realpath(lexical)).is_relative_to(Path(os.path.realpath(root)))

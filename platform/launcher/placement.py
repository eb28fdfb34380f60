"""Where a run's job runs (``rl_engine.jobspec.Placement``), decided here, once per launch.

Every field has this one writer: the run's own folder (its JSONL log and the trackers' local files go
there, placed by the engine), its checkpoint folder (``experiments.run_files``: the same folder the
resume check accepts checkpoints from), the checkpoint it resumes from (the one the resume endpoint
chose and checked, ``Run.resumed_from_checkpoint``), the ``http`` sink, no progress bar, the data roots,
and where the config's model and data paths point on the cluster: ``Run.inputs``, resolved by the policy
when the run was created (experiments.config_policy.resolved_inputs), not again here. The user's config
is read, never edited.
"""

from __future__ import annotations

from experiments import run_files
from experiments.config_policy import resolved_inputs
from experiments.models import Run
from experiments.path_policy import PathPolicy
from rl_engine.config import ExperimentConfig
from rl_engine.jobspec import HTTP_SINK, InputPaths, Placement


def run_placement(run: Run, cfg: ExperimentConfig, policy: PathPolicy | None = None) -> Placement:
    """Where ``run`` (whose frozen config is ``cfg``) runs."""
    policy = policy or PathPolicy.from_settings()
    checkpoint = run.resumed_from_checkpoint
    return Placement(
        run_dir=str(run_files.run_folder(run)),
        checkpoint_dir=str(run_files.checkpoint_folder(run)),
        resume_from=checkpoint.path if checkpoint is not None else None,
        sinks=(HTTP_SINK,),
        progress_bar=False,  # carriage-return bars make unreadable run events
        data_roots=tuple(str(p) for p in policy.data_roots),
        inputs=run_inputs(run, cfg, policy),
    )


def run_inputs(run: Run, cfg: ExperimentConfig, policy: PathPolicy) -> InputPaths:
    """Where ``run``'s job reads its inputs: as resolved when the run was created (``Run.inputs``), or,
    for a row from before they were stored, resolved now by the same function."""
    if run.inputs is not None:
        return InputPaths.model_validate(run.inputs)
    return resolved_inputs(cfg, run.project_id, policy)

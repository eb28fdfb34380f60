"""Where a run's job runs (``rl_engine.jobspec.Placement``), decided here, once per launch.

Every field has this one writer: the run's own folder (its JSONL log and the trackers' local files go
there, placed by the engine), its checkpoint folder (``experiments.run_files``: the same folder the
resume check accepts checkpoints from), the checkpoint it resumes from (the one the resume endpoint
chose and checked, ``Run.resumed_from_checkpoint``), the ``http`` sink, no progress bar, the data roots,
and where the config's model and data paths point on the cluster, in the form the path policy checked
them (experiments.config_policy, experiments.path_policy). The user's config is read, never edited.
"""

from __future__ import annotations

from experiments import run_files
from experiments.config_policy import built_place
from experiments.models import Run
from experiments.path_policy import PathPolicy
from rl_engine.config import DatasetDataConfig, ExperimentConfig, JsonlDataConfig
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
        inputs=input_paths(cfg, run.project_id, policy),
    )


def input_paths(cfg: ExperimentConfig, project_id: int, policy: PathPolicy) -> InputPaths:
    """The config's model and data paths in the form the policy checked them (absolute; a hub dataset in
    its hub-only form), and a model ``model.tiny`` builds or a dataset ``data.synthetic`` generates in
    project ``project_id``'s own folder (config_policy.built_place). Only what differs from the config."""
    model = cfg.model
    model_path = _model_path(model.path, policy)
    if model.tiny is not None and policy.model_roots:
        model_path = str(built_place(policy.model_roots[0], project_id, model.path))
    found: dict[str, str | None] = {
        "model_path": model_path,
        "tokenizer_path": _model_path(model.tokenizer_path, policy) if model.tokenizer_path else None,
    }
    data = cfg.data
    if isinstance(data, JsonlDataConfig | DatasetDataConfig):
        hub = isinstance(data, DatasetDataConfig)
        path = data.path
        if hub and data.synthetic is not None and policy.data_roots:
            path = str(built_place(policy.data_roots[0], project_id, data.path))
        found["data_path"] = _data_path(path, policy, hub=hub)
        found["validation_path"] = _data_path(data.validation_path, policy, hub=hub)
    if (
        isinstance(data, DatasetDataConfig)
        and data.cache_dir
        and policy.under(data.cache_dir, policy.data_roots)
    ):
        found["data_cache_dir"] = policy.absolute(data.cache_dir)
    own = {
        "model_path": model.path,
        "tokenizer_path": model.tokenizer_path,
        "data_path": getattr(data, "path", None),
        "validation_path": getattr(data, "validation_path", None),
        "data_cache_dir": getattr(data, "cache_dir", None),
    }
    return InputPaths(**{k: v for k, v in found.items() if v is not None and v != own[k]})


def _model_path(value: str, policy: PathPolicy) -> str:
    if value not in policy.allowed_models and policy.under(value, policy.model_roots):
        return policy.absolute(value)
    return value


def _data_path(value: str | None, policy: PathPolicy, *, hub: bool) -> str | None:
    ref = policy.data_ref(value, hub=hub) if value else None
    return ref.for_engine() if ref is not None else value

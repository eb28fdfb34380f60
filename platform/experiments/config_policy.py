"""What a config that comes through the platform may ask of the cluster (docs/api.md, "Trust boundary").

The engine's own CLI trusts its user; the platform runs configs of any project member on a shared
cluster, so it narrows every field that names a local path or a network endpoint:

- ``model.path`` / ``model.tokenizer_path``: one of ``ALLOWED_MODELS`` (verbatim) or a path under
  ``MODEL_ROOTS``.
- ``data.path`` / ``data.validation_path``: a path (file, glob or directory) under ``DATA_ROOTS``; for
  ``source: dataset`` also a hub dataset id ``namespace/name`` matching ``ALLOWED_DATASETS``, which the
  job's config names as ``hf://datasets/namespace/name`` so that ``datasets`` resolves it on the hub and
  in its cache only, never as a folder of the engine's working directory. ``data.cache_dir`` under
  ``DATA_ROOTS``; ``data.synthetic`` only with a ``data.path`` under ``DATA_ROOTS`` (it writes there);
  ``data.allow_download`` only where ``ALLOW_DATASET_DOWNLOADS``.
- Relative paths count from the engine's working directory (where the job runs); ``..`` and symlinks
  are resolved before the check, and the job's config gets the absolute path that was checked.
- ``trainer.checkpoint_dir``, ``trainer.resume_from`` and ``pipeline.ray_address`` belong to the
  platform: the launcher gives every run its own checkpoint folder, resume goes through the resume
  endpoint (from a checkpoint of a run of the same project), and a run joins the cluster it was
  submitted to. ``logging.jsonl_path`` is a file name the launcher places in the run's own folder.
- ``logging.mlflow.tracking_uri``: empty or ``sqlite:///NAME.db`` (a store the launcher places in the
  run's own folder, with its artifacts), or a server of ``ALLOWED_MLFLOW_SERVERS``, both read by the one
  strict URL parser (``rl_engine.strict_url``: no user-info, backslash, percent-encoding, dot segment);
  ``logging.mlflow.artifact_location`` and ``logging.wandb.dir`` belong to the platform (the run's folder).
- ``model.trust_remote_code`` only in projects an administrator has allowed it for.
- ``model.tiny`` and ``data.synthetic`` build into the project's own folder,
  ``<first root>/projects/project-<id>/<last component of the path>``, whatever the path says: a run
  never writes a model or a dataset where another project (or an allowed model name) reads it.

Violations are :class:`ConfigError` with field paths, i.e. HTTP 400s naming the field.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from experiments.path_policy import PathPolicy, list_text, roots_text
from experiments.run_files import CHECKPOINTS, checkpoint_folder, is_inside
from rl_engine.config import ConfigError
from rl_engine.presets import get_preset, preset_names
from rl_engine.strict_url import url_problem

if TYPE_CHECKING:
    from accounts.models import Project
    from tracking.models import Checkpoint

JSONL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.jsonl$")
SQLITE_NAME = re.compile(r"^sqlite:///([A-Za-z0-9][A-Za-z0-9._-]{0,99}\.db)$")
MLFLOW_DB, MLFLOW_ARTIFACTS, WANDB_DIR = "mlflow.db", "mlflow-artifacts", "wandb"
BUILT = "projects"  # under the first model / data root: what runs build (tiny models, synthetic data)
BUILT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")

OWNED_BY_PLATFORM = {
    "trainer.checkpoint_dir": "is set by the platform: every run checkpoints into its own folder; "
    "leave it empty (null)",
    "trainer.resume_from": "is set by the platform: to continue a finished run, use "
    "POST /api/runs/{id}/resume; leave it empty (null)",
    "pipeline.ray_address": "is set by the platform: a run joins the cluster the launcher submits it to; "
    "leave it empty (null)",
    "logging.mlflow.artifact_location": "is set by the platform: the artifacts of a store in the run's "
    "own folder go to that folder, a server's to its own artifact root; leave it empty (null)",
    "logging.wandb.dir": "is set by the platform: W&B keeps its files in the run's own folder; "
    "leave it empty (null)",
}
JSONL_NAME_RULE = "must be a file name ending in .jsonl (e.g. metrics.jsonl): the platform writes it into the run's own folder"
DOWNLOAD_RULE = (
    "this platform does not let runs download datasets (ALLOW_DATASET_DOWNLOADS is off): use a dataset "
    "under DATA_ROOTS or one already in the cluster's datasets cache"
)
MLFLOW_LOCAL_RULE = (
    "leave it empty (or a file name such as sqlite:///mlflow.db) for a store in the run's own folder"
)
REMOTE_CODE_RULE = (
    "this project may not run code shipped with a model; an administrator can allow it for the project "
    "(admin: Projects, 'allow trust_remote_code')"
)


def built_place(root: Path, project_id: int, value: str) -> Path:
    """Where the platform puts a model ``model.tiny`` builds, or a dataset ``data.synthetic`` generates:
    a folder of the project's own under the first root, named by the config's last path component.
    Never the config's own path: that could be a shared model other projects load by name."""
    return root / BUILT / f"project-{project_id}" / Path(value).name


def _built_name_violation(value: Any, roots: tuple[Path, ...], setting: str) -> str | None:
    if not roots:
        return f"builds into the first of {setting}, and none is configured"
    if not BUILT_NAME.match(Path(str(value)).name):
        return (
            f"{value!r}: its last component must be a folder name (letters, digits, . _ -): the platform "
            f"builds it in this project's own folder {roots[0] / BUILT}/project-<id>/"
        )
    return None


def _model_violations(config: dict[str, Any], policy: PathPolicy) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    model = config.get("model") or {}
    if model.get("tiny") is not None:
        problem = _built_name_violation(model.get("path"), policy.model_roots, "MODEL_ROOTS")
        if problem:
            out.append(("model.tiny", problem))
    for field in ("path", "tokenizer_path"):
        value = model.get(field)
        if value is not None and not policy.model_ok(str(value)):
            where = (
                f"under {roots_text(policy.model_roots)} (MODEL_ROOTS) or an allowed model "
                f"({list_text(policy.allowed_models)})"
            )
            out.append((f"model.{field}", f"{value!r} is not allowed here: use a model directory {where}"))
    return out


def _data_field_violation(field: str, value: str, policy: PathPolicy, *, hub: bool) -> str | None:
    ref = policy.data_ref(value, hub=hub)
    roots = f"under {roots_text(policy.data_roots)} (DATA_ROOTS)"
    if ref is None and not hub:
        return f"{value!r} is not allowed here: use a file {roots}"
    if ref is None:
        return (
            f"{value!r} is not allowed here: use a file, glob or directory {roots}, or a hub dataset id "
            "namespace/name (e.g. openai/gsm8k)"
        )
    if escapes := policy.data_escapes(ref):
        return (
            f"{value!r} is not allowed here: it reads {escapes[0]!r}, whose real path (symlinks followed) "
            f"leaves {roots_text(policy.data_roots)} (DATA_ROOTS)"
        )
    if ref.kind == "hub" and not policy.dataset_allowed(ref.value):
        allowed = list_text(tuple(policy.allowed_datasets))
        return f"hub dataset {ref.value!r} is not allowed here: allowed are {allowed} (ALLOWED_DATASETS)"
    return None


def _data_violations(config: dict[str, Any], policy: PathPolicy) -> list[tuple[str, str]]:
    data = config.get("data") or {}
    source = data.get("source")
    if source not in ("jsonl", "dataset"):
        return []  # built-in tasks read nothing
    out: list[tuple[str, str]] = []
    for field in ("path", "validation_path"):
        value = data.get(field)
        if value is not None or field == "path":
            problem = _data_field_violation(field, str(value or ""), policy, hub=source == "dataset")
            if problem:
                out.append((f"data.{field}", problem))
    if source == "jsonl":
        return out
    roots = f"under {roots_text(policy.data_roots)} (DATA_ROOTS)"
    cache = data.get("cache_dir")
    if cache is not None and not policy.under(str(cache), policy.data_roots):
        problem = (
            f"{cache!r} is not allowed here: leave it empty (the cluster's datasets cache) or use a folder"
        )
        out.append(("data.cache_dir", f"{problem} {roots}"))
    path_ref = policy.data_ref(str(data.get("path") or ""), hub=True)
    if data.get("synthetic") is not None and (path_ref is None or path_ref.kind != "path"):
        out.append(
            ("data.synthetic", f"writes a dataset at data.path, which must then be a directory {roots}")
        )
    elif data.get("synthetic") is not None:
        problem = _built_name_violation(data.get("path"), policy.data_roots, "DATA_ROOTS")
        if problem:
            out.append(("data.synthetic", problem))
    if data.get("allow_download") and not policy.allow_downloads:
        out.append(("data.allow_download", DOWNLOAD_RULE))
    return out


def _tracker_violations(config: dict[str, Any], policy: PathPolicy) -> list[tuple[str, str]]:
    logging_cfg = config.get("logging") or {}
    mlflow = logging_cfg.get("mlflow") or {}
    out: list[tuple[str, str]] = []
    uri = mlflow.get("tracking_uri")
    if uri is not None and not (SQLITE_NAME.match(str(uri)) or policy.mlflow_server_ok(str(uri))):
        servers = list_text(tuple(policy.mlflow_servers))
        server = f"or name an allowed MLflow server ({servers}; ALLOWED_MLFLOW_SERVERS)"
        malformed = url_problem(str(uri)) if str(uri).startswith(("http://", "https://")) else None
        why = f" (the URL {malformed})" if malformed else ""
        out.append(
            (
                "logging.mlflow.tracking_uri",
                f"{uri!r} is not allowed here{why}: {MLFLOW_LOCAL_RULE}, {server}",
            )
        )
    owned = {
        "logging.mlflow.artifact_location": mlflow.get("artifact_location"),
        "logging.wandb.dir": (logging_cfg.get("wandb") or {}).get("dir"),
    }
    out += [(field, OWNED_BY_PLATFORM[field]) for field, value in owned.items() if value is not None]
    return out


def _platform_field_violations(config: dict[str, Any], resume_from: str | None) -> list[tuple[str, str]]:
    trainer = config.get("trainer") or {}
    given = {
        "trainer.checkpoint_dir": trainer.get("checkpoint_dir") is not None,
        "trainer.resume_from": trainer.get("resume_from") != resume_from,
        "pipeline.ray_address": (config.get("pipeline") or {}).get("ray_address") is not None,
    }
    out = [(field, OWNED_BY_PLATFORM[field]) for field, bad in given.items() if bad]
    jsonl = (config.get("logging") or {}).get("jsonl_path")
    if jsonl is not None and not JSONL_NAME.match(str(jsonl)):
        out.append(("logging.jsonl_path", JSONL_NAME_RULE))
    return out


def config_violations(
    config: dict[str, Any],
    *,
    allow_remote_code: bool,
    resume_from: str | None = None,
    policy: PathPolicy | None = None,
) -> list[tuple[str, str]]:
    """(field.path, problem) for everything a normalised config asks that the platform does not allow."""
    policy = policy or PathPolicy.from_settings()
    out = _model_violations(config, policy) + _data_violations(config, policy)
    out += _platform_field_violations(config, resume_from)
    out += _tracker_violations(config, policy)
    if (config.get("model") or {}).get("trust_remote_code") and not allow_remote_code:
        out.append(("model.trust_remote_code", REMOTE_CODE_RULE))
    return out


def check_config(
    config: dict[str, Any], *, project: Project, resume_checkpoint: Checkpoint | None = None
) -> None:
    """Raise ConfigError unless ``config`` (normalised) may run in ``project``. ``resume_checkpoint``:
    the checkpoint the platform's resume chose; it must belong to a run of the same project and lie in
    that run's checkpoint folder, and only then may ``trainer.resume_from`` name it."""
    resume_from = None
    if resume_checkpoint is not None:
        source = resume_checkpoint.run
        inside = is_inside(resume_checkpoint.path, checkpoint_folder(source))
        if source.project_id != project.pk or not inside:
            problem = (
                f"checkpoint {resume_checkpoint.path!r} is not in the checkpoint folder of run {source.pk}"
            )
            raise ConfigError([("trainer.resume_from", f"{problem} of this project")])
        resume_from = resume_checkpoint.path
    problems = config_violations(
        config, allow_remote_code=bool(project.allow_trust_remote_code), resume_from=resume_from
    )
    if problems:
        raise ConfigError(problems)


def without_platform_fields(config: dict[str, Any]) -> dict[str, Any]:
    """A copy with the fields the platform sets cleared (what a resumed run starts from)."""
    out = copy.deepcopy(config)
    out.setdefault("trainer", {}).update(checkpoint_dir=None, resume_from=None)
    out.setdefault("pipeline", {})["ray_address"] = None
    return out


def launch_config(
    config: dict[str, Any],
    *,
    folder: Path,
    resume_from: str | None,
    project_id: int,
    policy: PathPolicy | None = None,
) -> dict[str, Any]:
    """The config a run's job gets: the platform's fields set whatever the stored config says (a config
    stored before this policy, or edited in the admin, cannot point a run elsewhere), every path the
    policy checked in the form it checked (absolute; a hub dataset in its hub-only form), and a model
    ``model.tiny`` builds or a dataset ``data.synthetic`` generates in project ``project_id``'s own
    folder (built_place)."""
    policy = policy or PathPolicy.from_settings()
    out = without_platform_fields(config)
    out["trainer"].update(checkpoint_dir=str(folder / CHECKPOINTS), resume_from=resume_from)
    model = out.get("model") or {}
    for field in ("path", "tokenizer_path"):
        value = model.get(field)
        if value and value not in policy.allowed_models and policy.under(str(value), policy.model_roots):
            model[field] = policy.absolute(str(value))
    if model.get("tiny") is not None and policy.model_roots:
        model["path"] = str(built_place(policy.model_roots[0], project_id, str(model["path"])))
    data = out.get("data") or {}
    if data.get("synthetic") is not None and policy.data_roots:
        data["path"] = str(built_place(policy.data_roots[0], project_id, str(data["path"])))
    _place_data(data, policy)
    _place_logs(out.setdefault("logging", {}), folder)
    return out


def _place_data(data: dict[str, Any], policy: PathPolicy) -> None:
    if data.get("source") not in ("jsonl", "dataset"):
        return
    for field in ("path", "validation_path"):
        ref = policy.data_ref(str(data[field]), hub=data["source"] == "dataset") if data.get(field) else None
        if ref is not None:
            data[field] = ref.for_engine()
    if data.get("cache_dir") and policy.under(str(data["cache_dir"]), policy.data_roots):
        data["cache_dir"] = policy.absolute(str(data["cache_dir"]))


def _place_logs(logging_cfg: dict[str, Any], folder: Path) -> None:
    """The JSONL log, a local MLflow store with its artifacts, and W&B's files go to the run's folder."""
    if logging_cfg.get("jsonl_path"):
        logging_cfg["jsonl_path"] = str(folder / Path(str(logging_cfg["jsonl_path"])).name)
    sinks = logging_cfg.get("sinks") or []
    mlflow = logging_cfg.setdefault("mlflow", {})
    mlflow["artifact_location"] = None
    local = SQLITE_NAME.match(str(mlflow.get("tracking_uri") or f"sqlite:///{MLFLOW_DB}"))
    if "mlflow" in sinks and local:
        mlflow["tracking_uri"] = f"sqlite:///{folder / local.group(1)}"
        mlflow["artifact_location"] = str(folder / MLFLOW_ARTIFACTS)
    logging_cfg.setdefault("wandb", {})["dir"] = str(folder / WANDB_DIR) if "wandb" in sinks else None


def platform_preset(name: str) -> dict[str, Any]:
    """The engine's preset as this platform accepts it: a tiny model is built under the first model
    root, a generated dataset under the first data root (the engine's own defaults, ``var/models/...``
    and ``var/data/...``, count from the working directory)."""
    config = get_preset(name)
    model = config.get("model") or {}
    if model.get("tiny") is not None and settings.MODEL_ROOTS:
        model["path"] = str(Path(settings.MODEL_ROOTS[0]) / Path(str(model["path"])).name)
    data = config.get("data") or {}
    if data.get("synthetic") is not None and settings.DATA_ROOTS:
        data["path"] = str(Path(settings.DATA_ROOTS[0]) / Path(str(data["path"])).name)
    return config


def platform_presets() -> dict[str, dict[str, Any]]:
    return {name: platform_preset(name) for name in preset_names()}

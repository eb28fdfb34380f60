"""What a config that comes through the platform may ask of the cluster (docs/api.md, "Trust boundary").

The engine's own CLI trusts its user; the platform runs configs of any project member on a shared
cluster, so it narrows every field that names a local path or a network endpoint. Read-only checks on
the typed config: where a run's job then reads and writes is its placement, which the launcher builds
(launcher.placement), never an edit of the config.

- ``model.path`` / ``model.tokenizer_path``: one of ``ALLOWED_MODELS`` (verbatim) or a path under
  ``MODEL_ROOTS``.
- ``data.path`` / ``data.validation_path``: a path (file, glob or directory) under ``DATA_ROOTS``, a
  directory only if what its dataset card (or ``save_to_disk`` manifest) names stays there too and is no
  URL (``rl_engine.dataset_folder``, the resolver the engine reads the folder with); for
  ``source: dataset`` also a hub dataset id ``namespace/name`` matching ``ALLOWED_DATASETS``, which the
  job reads as ``hf://datasets/namespace/name`` so that ``datasets`` resolves it on the hub and in its
  cache only, never as a folder of the engine's working directory. ``data.cache_dir`` under
  ``DATA_ROOTS``; ``data.synthetic`` only with a ``data.path`` under ``DATA_ROOTS`` (it writes there);
  ``data.allow_download`` only where ``ALLOW_DATASET_DOWNLOADS``.
- Relative paths count from the engine's working directory (where the job runs); ``..`` and symlinks
  are resolved before the check, and the job reads the absolute path that was checked.
- Where a run checkpoints, resumes from, which cluster it joins and where its JSONL log and trackers'
  files go are not in the config at all (they moved to the placement): every run gets its own folder,
  resume goes through the resume endpoint (from a checkpoint of a run of the same project, checked by
  :func:`check_resume_checkpoint`), and a run joins the cluster it was submitted to.
- ``logging.mlflow.tracking_uri``: empty or ``sqlite:///NAME.db`` (a store the engine places in the
  run's own folder, with its artifacts), or a server of ``ALLOWED_MLFLOW_SERVERS``, both read by the one
  strict URL parser (``rl_engine.strict_url``: no user-info, backslash, percent-encoding, dot segment).
- ``model.trust_remote_code`` only in projects an administrator has allowed it for.
- ``model.tiny`` and ``data.synthetic`` build into the project's own folder,
  ``<first root>/projects/project-<id>/<last component of the path>``, whatever the path says: a run
  never writes a model or a dataset where another project (or an allowed model name) reads it.
- ``resources``: what a run asks of the cluster is bounded (``RUN_MAX_GPUS`` for the trainer group and
  for the rollouters together, ``RUN_MAX_CPUS_PER_ACTOR``), and a custom Ray resource
  (``trainer_node_resources``, ``rollout_node_resources``) only one the deployment lists in
  ``ALLOWED_NODE_RESOURCES``; ``node:<address>`` (Ray's resource of one machine) never.

- ``reward.kwargs.url`` / ``reward.combine[i].kwargs.url`` of the remote reward ``http``: a service of
  ``ALLOWED_REWARD_SERVICES`` (read by the one strict URL parser, as the MLflow servers are; none by
  default: the engine posts every prompt and response there). ``reward.kwargs.path`` of the reward model
  ``model``: a model ``model.path`` could name; its ``num_gpus`` / ``num_cpus`` within the run's bounds.
- ``reward.name`` / ``reward.combine[i].name``: a reward the engine's environment offers
  (``experiments.engine_catalogue``: ``ENGINE_PYTHON -m rl_engine rewards --json``): a reward plugin
  installed where this web process runs but not where the runs run is refused here, not inside the job.
  When the engine does not answer, a built-in passes (it ships with the engine) and a plugin is refused.

Violations are :class:`ConfigError` with field paths, i.e. HTTP 400s naming the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from experiments import engine_catalogue
from experiments.path_policy import PathPolicy, list_text, roots_text
from experiments.run_files import checkpoint_folder, is_inside
from rl_engine.catalogue import module_names
from rl_engine.config import (
    ConfigError,
    DatasetDataConfig,
    ExperimentConfig,
    JsonlDataConfig,
    MlflowConfig,
    ModelConfig,
    ResourcesConfig,
    parse_config,
    unknown_targets,
)
from rl_engine.config import names as config_names
from rl_engine.jobspec import InputPaths
from rl_engine.presets import get_preset, preset_names
from rl_engine.strict_url import url_problem

if TYPE_CHECKING:
    from accounts.models import Project
    from tracking.models import Checkpoint

SQLITE_NAME = re.compile(r"^sqlite:///([A-Za-z0-9][A-Za-z0-9._-]{0,99}\.db)$")
BUILT = "projects"  # under the first model / data root: what runs build (tiny models, synthetic data)
BUILT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")

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


NODE_PREFIX = "node:"  # Ray gives every machine the resource node:<its address>


@dataclass(frozen=True)
class ResourcePolicy:
    """What a run from the platform may ask of the cluster (settings ``RUN_MAX_GPUS``,
    ``RUN_MAX_CPUS_PER_ACTOR``, ``ALLOWED_NODE_RESOURCES``)."""

    max_gpus: int = 64
    max_cpus_per_actor: float = 64.0
    node_resources: frozenset[str] = frozenset()  # custom Ray resources members may name

    @classmethod
    def from_settings(cls) -> ResourcePolicy:
        return cls(
            max_gpus=int(getattr(settings, "RUN_MAX_GPUS", cls.max_gpus)),
            max_cpus_per_actor=float(getattr(settings, "RUN_MAX_CPUS_PER_ACTOR", cls.max_cpus_per_actor)),
            node_resources=frozenset(getattr(settings, "ALLOWED_NODE_RESOURCES", [])),
        )


class CheckpointRefused(ValueError):
    """The checkpoint a resume would start from is not one of a run of this project, in its folder."""


def built_place(root: Path, project_id: int, value: str) -> Path:
    """Where the platform puts a model ``model.tiny`` builds, or a dataset ``data.synthetic`` generates:
    a folder of the project's own under the first root, named by the config's last path component.
    Never the config's own path: that could be a shared model other projects load by name."""
    return root / BUILT / f"project-{project_id}" / Path(value).name


def _built_name_violation(value: str, roots: tuple[Path, ...], setting: str) -> str | None:
    if not roots:
        return f"builds into the first of {setting}, and none is configured"
    if not BUILT_NAME.match(Path(value).name):
        return (
            f"{value!r}: its last component must be a folder name (letters, digits, . _ -): the platform "
            f"builds it in this project's own folder {roots[0] / BUILT}/project-<id>/"
        )
    return None


def _model_violations(model: ModelConfig, policy: PathPolicy) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if model.tiny is not None:
        problem = _built_name_violation(model.path, policy.model_roots, "MODEL_ROOTS")
        if problem:
            out.append(("model.tiny", problem))
    for field, value in (("path", model.path), ("tokenizer_path", model.tokenizer_path)):
        if value is not None and policy.model_place(value) is None:
            where = (
                f"under {roots_text(policy.model_roots)} (MODEL_ROOTS) or an allowed model "
                f"({list_text(policy.allowed_models)})"
            )
            out.append((f"model.{field}", f"{value!r} is not allowed here: use a model directory {where}"))
    return out


def _lora_violations(model: ModelConfig, policy: PathPolicy) -> list[tuple[str, str]]:
    """``model.lora.target_modules`` the model folder has no module of (read from its safetensors headers,
    no torch: ``rl_engine.catalogue.module_names``), so a typo is a 400 at create, not a failed job. A
    folder the platform cannot read here (a hub name, a model only the cluster sees) is left to the engine's
    own check when the job starts."""
    if model.lora is None or model.tiny is not None:
        return []
    place = policy.model_place(model.path)
    root = next((r for r in policy.model_roots if place and is_inside(place, r)), None)
    if place is None or root is None:
        return []
    names = module_names(place, root)
    missing = unknown_targets(model.lora, names) if names is not None else []
    if not missing:
        return []
    shown = ", ".join(sorted({n.rsplit(".", 1)[-1] for n in names or ()}))[:300]
    return [("model.lora.target_modules", f"the model has no module {missing[0]!r}; its modules: {shown}")]


def _data_field_violation(
    value: str, policy: PathPolicy, *, hub: bool, config_name: str | None = None
) -> str | None:
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
    if hub and (problem := policy.data_folder_problem(ref, config_name)):
        return f"{value!r} is not allowed here: {problem} (DATA_ROOTS)"
    if ref.kind == "hub" and not policy.dataset_allowed(ref.value):
        allowed = list_text(tuple(policy.allowed_datasets))
        return f"hub dataset {ref.value!r} is not allowed here: allowed are {allowed} (ALLOWED_DATASETS)"
    return None


def _data_violations(cfg: ExperimentConfig, policy: PathPolicy) -> list[tuple[str, str]]:
    data = cfg.data
    if not isinstance(data, JsonlDataConfig | DatasetDataConfig):
        return []  # built-in tasks read nothing
    hub = isinstance(data, DatasetDataConfig)
    out: list[tuple[str, str]] = []
    name = data.name if isinstance(data, DatasetDataConfig) else None
    for field, value in (("path", data.path), ("validation_path", data.validation_path)):
        if value is not None:
            problem = _data_field_violation(value, policy, hub=hub, config_name=name)
            if problem:
                out.append((f"data.{field}", problem))
    if not isinstance(data, DatasetDataConfig):
        return out
    roots = f"under {roots_text(policy.data_roots)} (DATA_ROOTS)"
    if data.cache_dir is not None and not policy.under(data.cache_dir, policy.data_roots):
        problem = (
            f"{data.cache_dir!r} is not allowed here: leave it empty (the cluster's datasets cache) or use "
            "a folder"
        )
        out.append(("data.cache_dir", f"{problem} {roots}"))
    path_ref = policy.data_ref(data.path, hub=True)
    if data.synthetic is not None and (path_ref is None or path_ref.kind != "path"):
        out.append(
            ("data.synthetic", f"writes a dataset at data.path, which must then be a directory {roots}")
        )
    elif data.synthetic is not None:
        problem = _built_name_violation(data.path, policy.data_roots, "DATA_ROOTS")
        if problem:
            out.append(("data.synthetic", problem))
    if data.allow_download and not policy.allow_downloads:
        out.append(("data.allow_download", DOWNLOAD_RULE))
    return out


def _tracker_violations(mlflow: MlflowConfig, policy: PathPolicy) -> list[tuple[str, str]]:
    uri = mlflow.tracking_uri
    if uri is None or SQLITE_NAME.match(uri) or policy.mlflow_server_ok(uri):
        return []
    servers = list_text(tuple(policy.mlflow_servers))
    server = f"or name an allowed MLflow server ({servers}; ALLOWED_MLFLOW_SERVERS)"
    malformed = url_problem(uri) if uri.startswith(("http://", "https://")) else None
    why = f" (the URL {malformed})" if malformed else ""
    return [
        ("logging.mlflow.tracking_uri", f"{uri!r} is not allowed here{why}: {MLFLOW_LOCAL_RULE}, {server}")
    ]


def _node_resource_violation(names: list[str], policy: ResourcePolicy) -> str | None:
    pinned = [n for n in names if n.startswith(NODE_PREFIX)]
    if pinned:
        return (
            f"{pinned[0]!r} pins the run to one machine of the cluster: a run from the platform may not "
            "ask for node:<address> resources"
        )
    unknown = [n for n in names if n not in policy.node_resources]
    if unknown:
        allowed = list_text(tuple(sorted(policy.node_resources)))
        return (
            f"{unknown[0]!r} is not a custom resource runs may ask for here: allowed are {allowed} "
            "(ALLOWED_NODE_RESOURCES)"
        )
    return None


def _resource_violations(
    resources: ResourcesConfig, rollouters: int, policy: ResourcePolicy
) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    limit = f"this platform allows at most {policy.max_gpus} (RUN_MAX_GPUS)"
    if resources.trainer_gpus > policy.max_gpus:
        out.append(
            ("resources.trainer_gpus", f"{resources.trainer_gpus} GPUs for the trainer group: {limit}")
        )
    if resources.rollout_gpus * rollouters > policy.max_gpus:
        asked = (
            f"{resources.rollout_gpus} GPUs per rollouter x {rollouters} rollouters (pipeline.num_rollouters)"
        )
        out.append(("resources.rollout_gpus", f"{asked}: {limit}"))
    if resources.cpus_per_actor > policy.max_cpus_per_actor:
        out.append(
            (
                "resources.cpus_per_actor",
                f"{resources.cpus_per_actor:g} CPUs per actor: this platform allows at most "
                f"{policy.max_cpus_per_actor:g} (RUN_MAX_CPUS_PER_ACTOR)",
            )
        )
    for field in ("trainer_node_resources", "rollout_node_resources"):
        problem = _node_resource_violation(sorted(getattr(resources, field)), policy)
        if problem:
            out.append((f"resources.{field}", problem))
    return out


def _reward_place_violations(
    cfg: ExperimentConfig, policy: PathPolicy, resources: ResourcePolicy
) -> list[tuple[str, str]]:
    """Where a reward reaches outside the engine: a remote reward service (``http``) whose ``url`` the
    operator has not listed in ``ALLOWED_REWARD_SERVICES`` (the engine would post every prompt and
    response there from inside the cluster); a reward model (``model``) whose ``path`` is not a model the
    platform allows (``model.path``'s rule) or that asks more of the cluster than a run may."""
    out: list[tuple[str, str]] = []
    reward = cfg.reward
    parts = (
        [("kwargs", reward.name, reward.kwargs)]
        if reward.combine is None
        else [(f"combine[{i}].kwargs", p.name, p.kwargs) for i, p in enumerate(reward.combine)]
    )
    for where, name, kwargs in parts:
        field = f"reward.{where}"
        url, path = kwargs.get("url"), kwargs.get("path")
        if name == "http" and isinstance(url, str) and not policy.reward_service_ok(url):
            services = list_text(tuple(policy.reward_services))
            out.append(
                (
                    f"{field}.url",
                    f"{url[:200]!r} is not a reward service this platform allows: name one of {services} "
                    "(ALLOWED_REWARD_SERVICES)",
                )
            )
        if name != "model":
            continue
        if isinstance(path, str) and policy.model_place(path) is None:
            where_ok = (
                f"under {roots_text(policy.model_roots)} (MODEL_ROOTS) or an allowed model "
                f"({list_text(policy.allowed_models)})"
            )
            out.append(
                (f"{field}.path", f"{path[:200]!r} is not allowed here: use a model directory {where_ok}")
            )
        gpus, cpus = kwargs.get("num_gpus", 0), kwargs.get("num_cpus", 1)
        if isinstance(gpus, int | float) and gpus > resources.max_gpus:
            out.append((f"{field}.num_gpus", f"at most {resources.max_gpus} (RUN_MAX_GPUS)"))
        if isinstance(cpus, int | float) and cpus > resources.max_cpus_per_actor:
            out.append(
                (f"{field}.num_cpus", f"at most {resources.max_cpus_per_actor:g} (RUN_MAX_CPUS_PER_ACTOR)")
            )
    return out


def _reward_violations(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """Each reward the config names that the engine's environment does not offer (or offers broken). A
    config of built-ins only asks nothing: they ship with the engine (and a launch spawns no catalogue)."""
    if all(name in config_names.REWARDS.names for _, name in cfg.reward.named()):
        return []
    try:
        offered: dict[str, dict[str, Any]] | None = engine_catalogue.engine_rewards()
        unavailable = ""
    except engine_catalogue.CatalogueUnavailable as exc:
        offered, unavailable = None, str(exc)
    out: list[tuple[str, str]] = []
    for where, name in cfg.reward.named():
        field = f"reward.{where}"
        if offered is None:
            if name not in config_names.REWARDS.names:
                out.append((field, f"reward plugin {name!r} cannot be checked: {unavailable}"))
            continue
        entry = offered.get(name)
        if entry is None:
            plugins = sorted(n for n, e in offered.items() if e.get("origin") == "plugin")
            out.append(
                (
                    field,
                    f"the engine where runs run offers no reward {name!r} (its plugins: "
                    f"{', '.join(plugins) or 'none'}): install the plugin there (ENGINE_PYTHON)",
                )
            )
        elif entry.get("error"):
            out.append((field, f"the engine where runs run cannot load it: {str(entry['error'])[:300]}"))
    return out


def config_violations(
    cfg: ExperimentConfig,
    *,
    allow_remote_code: bool,
    policy: PathPolicy | None = None,
    resources: ResourcePolicy | None = None,
) -> list[tuple[str, str]]:
    """(field.path, problem) for everything ``cfg`` asks that the platform does not allow."""
    policy = policy or PathPolicy.from_settings()
    resources = resources or ResourcePolicy.from_settings()
    out = _model_violations(cfg.model, policy) + _data_violations(cfg, policy)
    if not out:  # the model folder is one the policy allows: its modules may be read
        out += _lora_violations(cfg.model, policy)
    out += _tracker_violations(cfg.logging.mlflow, policy)
    out += _resource_violations(cfg.resources, cfg.pipeline.num_rollouters, resources)
    if cfg.model.trust_remote_code and not allow_remote_code:
        out.append(("model.trust_remote_code", REMOTE_CODE_RULE))
    out += _reward_violations(cfg)
    out += _reward_place_violations(cfg, policy, resources)
    return out


def resolved_inputs(cfg: ExperimentConfig, project_id: int, policy: PathPolicy) -> InputPaths:
    """Where the job of a permitted ``cfg`` in project ``project_id`` reads its model and data: each path
    in the form the policy checked it (``PathPolicy.model_place``, ``PathPolicy.data_ref``: absolute; a
    hub dataset in its hub-only form), and a model ``model.tiny`` builds or a dataset ``data.synthetic``
    generates in the project's own folder (:func:`built_place`). Only what differs from the config."""
    model = cfg.model
    model_path = policy.model_place(model.path) or model.path
    if model.tiny is not None and policy.model_roots:
        model_path = str(built_place(policy.model_roots[0], project_id, model.path))
    found: dict[str, str | None] = {
        "model_path": model_path,
        "tokenizer_path": (policy.model_place(model.tokenizer_path) or model.tokenizer_path)
        if model.tokenizer_path
        else None,
    }
    data = cfg.data
    if isinstance(data, JsonlDataConfig | DatasetDataConfig):
        hub = isinstance(data, DatasetDataConfig)
        path = data.path
        if hub and data.synthetic is not None and policy.data_roots:
            path = str(built_place(policy.data_roots[0], project_id, data.path))
        found["data_path"] = _data_place(path, policy, hub=hub)
        found["validation_path"] = _data_place(data.validation_path, policy, hub=hub)
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


def _data_place(value: str | None, policy: PathPolicy, *, hub: bool) -> str | None:
    ref = policy.data_ref(value, hub=hub) if value else None
    return ref.for_engine() if ref is not None else value


@dataclass(frozen=True)
class PermittedConfig:
    """A config the platform's policy accepted for one project, and where its job reads its inputs: what
    ``check_config`` answers, so that a caller holding one (a sweep's planned point) hands it on and
    nothing checks or resolves it again (``run_create`` stores ``inputs`` with the run, the launcher's
    placement reads them back)."""

    config: ExperimentConfig
    project_id: int
    inputs: InputPaths


def check_config(
    cfg: ExperimentConfig, *, project: Project, policy: PathPolicy | None = None
) -> PermittedConfig:
    """``cfg`` as permitted in ``project``; ConfigError naming the refused fields otherwise."""
    policy = policy or PathPolicy.from_settings()
    problems = config_violations(cfg, allow_remote_code=bool(project.allow_trust_remote_code), policy=policy)
    if problems:
        raise ConfigError(problems)
    return PermittedConfig(config=cfg, project_id=project.pk, inputs=resolved_inputs(cfg, project.pk, policy))


def check_resume_checkpoint(checkpoint: Checkpoint, *, project: Project) -> None:
    """Raise CheckpointRefused unless ``checkpoint`` belongs to a run of ``project``, lies in that run's
    checkpoint folder (a member may post any path as a checkpoint event) and was not pruned."""
    source = checkpoint.run
    if source.project_id != project.pk or not is_inside(checkpoint.path, checkpoint_folder(source)):
        raise CheckpointRefused(
            f"checkpoint {checkpoint.path!r} is not in the checkpoint folder of run {source.pk} of this project"
        )
    if checkpoint.pruned_at is not None:
        raise CheckpointRefused(
            f"checkpoint at step {checkpoint.step} of run {source.pk} was removed by the engine "
            f"(trainer.keep_checkpoints): resume or fork from one it kept"
        )


def platform_preset(name: str) -> ExperimentConfig:
    """The engine's preset as this platform accepts it: its model (a tiny one it builds, or a catalogue
    model ``models fetch`` brings) under the first model root, a generated dataset under the first data
    root (the engine's own defaults, ``var/models/...`` and ``var/data/...``, count from the working
    directory); a model given by absolute path stays as it is."""
    cfg = parse_config(get_preset(name))
    if not Path(cfg.model.path).is_absolute() and settings.MODEL_ROOTS:
        path = str(Path(settings.MODEL_ROOTS[0]) / Path(cfg.model.path).name)
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": path})})
    if isinstance(cfg.data, DatasetDataConfig) and cfg.data.synthetic is not None and settings.DATA_ROOTS:
        path = str(Path(settings.DATA_ROOTS[0]) / Path(cfg.data.path).name)
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"path": path})})
    return cfg


def preset_document(name: str) -> dict[str, Any]:
    """:func:`platform_preset` as the API serves it: the preset's own fields (defaults left out)."""
    return platform_preset(name).model_dump(mode="json", exclude_unset=True)


def platform_presets() -> dict[str, dict[str, Any]]:
    return {name: preset_document(name) for name in preset_names()}

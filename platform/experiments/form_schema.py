"""The form a project's members write experiments with (the new-experiment page,
``GET /api/schema/experiment?project=ID``): the engine's JSON Schema
(``rl_engine.config.experiment_json_schema``) narrowed by this platform's policy
(``experiments.config_policy``, docs/api.md "Trust boundary") for one project, so that the form offers
what the platform accepts and nothing it refuses:

- absent: what the policy refuses or the platform sets itself: ``model.trust_remote_code`` (unless the
  project allows it), ``data.allow_download`` (unless ``ALLOW_DATASET_DOWNLOADS``), ``data.cache_dir``
  (the cluster's datasets cache), the ``http`` sink (every run gets it), the custom Ray resources that
  pin a run to nodes (unless ``ALLOWED_NODE_RESOURCES`` lists some; then only those names),
  ``model.tiny`` / ``data.synthetic`` without a model / data root to build them in;
- choices: ``model.path`` and ``model.tokenizer_path`` among the model catalogue
  (``model_catalogue.available_models``, labelled with size, chat template and backends), with free text
  only where ``MODEL_ROOTS`` lets a path under them (or a tiny model's folder) be named;
  ``logging.mlflow.tracking_uri`` among a store in the run's own folder and ``ALLOWED_MLFLOW_SERVERS``;
  ``reward.name`` and ``reward.combine[i].name`` among the built-ins and the reward plugins the engine's
  environment offers (``engine_catalogue``; a plugin labelled with its package), the built-ins alone
  when the engine does not answer; ``env.name`` likewise among the built-in environments and the
  environment plugins installed both in the engine's environment and here (found by their metadata,
  nothing imported);
- bounds: ``RUN_MAX_GPUS``, ``RUN_MAX_CPUS_PER_ACTOR``;
- grouped: what a run asks of the cluster (``resources``, devices, thread counts, engine parallelism,
  the number of rollouters) carries ``"x-group": "cluster"``: the form draws it in a section of its own,
  apart from the training fields; the engine's ``"x-essential"`` fields still come first.

Annotations the form reads besides JSON Schema's own: ``x-essential``, ``x-group``, ``x-choices``
(``[{value, label}]``), ``x-free-text`` (what else may be typed); a closed choice is also an ``enum``.
The server stays the judge: a config posted another way (YAML, the API) is checked by the same policy.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from experiments import engine_catalogue
from experiments.config_policy import ResourcePolicy
from experiments.model_catalogue import available_models
from experiments.path_policy import PathPolicy, roots_text
from rl_engine.catalogue import ModelInfo
from rl_engine.config import experiment_json_schema
from rl_engine.config import names as config_names
from rl_engine.strict_url import url_problem

if TYPE_CHECKING:
    from accounts.models import Project

CLUSTER = "cluster"
# What a run asks of the cluster rather than how it trains: drawn together in the form's Cluster section.
CLUSTER_FIELDS = (
    "resources",
    "trainer.device",
    "trainer.num_threads",
    "trainer.world_size",
    "rollout.device",
    "rollout.num_threads",
    "rollout.tensor_parallel_size",
    "rollout.gpu_memory_utilization",
    "rollout.cpu_kvcache_space_gb",
    "rollout.tp_size",
    "rollout.mem_fraction_static",
    "pipeline.num_rollouters",
)
PLATFORM_SINKS = ("http",)  # the sinks the launcher adds to every run itself
LOCAL_MLFLOW_STORE = "sqlite:///mlflow.db"  # a store in the run's own folder (config_policy.SQLITE_NAME)
NODE_RESOURCES = ("resources.trainer_node_resources", "resources.rollout_node_resources")


@dataclass(frozen=True)
class FormPolicy:
    """What the form of one project is narrowed by."""

    allow_remote_code: bool
    paths: PathPolicy
    resources: ResourcePolicy
    models: tuple[ModelInfo, ...]
    plugins: tuple[tuple[str, str], ...] = ()  # (name, label) of each reward plugin the form offers
    env_plugins: tuple[tuple[str, str], ...] = ()  # (name, label) of each environment plugin it offers

    @classmethod
    def for_project(cls, project: Project) -> FormPolicy:
        return cls(
            allow_remote_code=bool(project.allow_trust_remote_code),
            paths=PathPolicy.from_settings(),
            resources=ResourcePolicy.from_settings(),
            models=tuple(available_models()),
            plugins=offered_plugins(),
            env_plugins=offered_env_plugins(),
        )


def offered_plugins() -> tuple[tuple[str, str], ...]:
    """(name, label) of the reward plugins both the engine's environment offers (and loads) and this
    process's config accepts (installed here too: it checks their arguments); none when the engine does
    not answer."""
    try:
        engine = engine_catalogue.engine_rewards()
    except engine_catalogue.CatalogueUnavailable:
        return ()
    here = config_names.reward_plugins()
    return tuple(
        (name, f"{name} (plugin: {entry.get('package')} {entry.get('version')})")
        for name, entry in sorted(engine.items())
        if entry.get("origin") == "plugin" and not entry.get("error") and name in here
    )


def offered_env_plugins() -> tuple[tuple[str, str], ...]:
    """(name, label) of the environment plugins installed in the engine's environment and here (the
    config check runs here: ``rl_engine.config.env``), both found by their metadata; none when the
    engine does not answer."""
    here = set(config_names.environment_plugins())
    if not here:
        return ()  # nothing to offer whatever the engine has: it is not asked
    try:
        engine = engine_catalogue.engine_environments()
    except engine_catalogue.CatalogueUnavailable:
        return ()
    return tuple(
        (name, f"{name} (plugin: {entry.get('package')} {entry.get('version')})")
        for name, entry in sorted(engine.items())
        if entry.get("origin") == "plugin" and name in here
    )


def form_schema(project: Project) -> dict[str, Any]:
    """The form's schema for ``project``, from this deployment's settings and model catalogue."""
    return narrowed_schema(FormPolicy.for_project(project), project_id=project.pk)


def _count(parameters: int) -> str:
    """134_515_008 -> "134.5M", 1_235_814_400 -> "1.2B", 12_416 -> "12.4K"."""
    for scale, unit in ((1e9, "B"), (1e6, "M")):
        if parameters >= scale:
            return f"{parameters / scale:.1f}{unit}"
    return f"{parameters / 1e3:.1f}K"


def model_label(info: ModelInfo) -> str:
    """``smollm2-135m-instruct (134.5M, chat, hf/vllm-cpu)``: what the picker shows for a model."""
    size = _count(info.parameters) if info.parameters else "size unknown"
    parts = [size, "chat" if info.chat_template else "no chat template", "/".join(info.backends)]
    if info.remote_code:
        parts.append("ships code")
    return f"{info.name} ({', '.join(p for p in parts if p)})"


# --- walking the schema ----------------------------------------------------------------------------------


def _objects(schema: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    """The object schemas ``node`` stands for (the very dicts of ``$defs``, so that an edit applies where
    they are referred to): its reference, each member of a union or of ``X | None``."""
    if "$ref" in node:
        return _objects(schema, schema["$defs"][node["$ref"].rsplit("/", 1)[1]])
    members = node.get("oneOf") or node.get("anyOf")
    if members:
        return [obj for member in members for obj in _objects(schema, member)]
    return [node] if "properties" in node else []


def _owners(schema: dict[str, Any], path: str) -> Iterator[tuple[dict[str, Any], str]]:
    """(object schema, field name) of each place the dotted ``path`` names: more than one where a union's
    kinds share the field (``rollout.device``: hf and vllm)."""
    *parents, name = path.split(".")
    objects = [schema]
    for part in parents:
        objects = [
            o
            for obj in objects
            if part in obj["properties"]
            for o in _objects(schema, obj["properties"][part])
        ]
    for obj in objects:
        if name in obj["properties"]:
            yield obj, name


def _fields(schema: dict[str, Any], path: str) -> list[dict[str, Any]]:
    found = [obj["properties"][name] for obj, name in _owners(schema, path)]
    if not found:  # the engine renamed or removed it: this module must follow
        raise LookupError(f"the engine's config schema has no field {path}")
    return found


def _drop(schema: dict[str, Any], path: str) -> None:
    owners = list(_owners(schema, path))
    if not owners:
        raise LookupError(f"the engine's config schema has no field {path}")
    for obj, name in owners:
        del obj["properties"][name]
        if name in obj.get("required", []):
            obj["required"].remove(name)


# --- the narrowing ---------------------------------------------------------------------------------------


def _choice(field: dict[str, Any], choices: list[tuple[Any, str]], free_text: str | None) -> None:
    """Offer ``choices`` ((value, label)) in a string field (or a nullable one: null stays a choice), and
    free text with the hint ``free_text`` where given; without it the field is closed (an ``enum``)."""
    target = field
    if "anyOf" in field:  # X | None: narrow X
        target = next(member for member in field["anyOf"] if member.get("type") != "null")
    target["x-choices"] = [{"value": value, "label": label} for value, label in choices]
    if free_text:
        target["x-free-text"] = free_text
    else:
        target["enum"] = [value for value, _ in choices]


def _model_free_text(policy: FormPolicy) -> str | None:
    """What may be typed besides the catalogue's models: a path under MODEL_ROOTS (or where model.tiny
    builds one), and the ALLOWED_MODELS entries that are no model folder here (e.g. a hub id)."""
    listed = {info.path for info in policy.models}
    names = sorted(policy.paths.allowed_models - listed)
    ways = []
    if policy.paths.model_roots:
        roots = roots_text(policy.paths.model_roots)
        ways.append(f"a model folder under {roots} (MODEL_ROOTS), or where model.tiny builds one")
    if names:
        ways.append(f"an allowed name: {', '.join(names)} (ALLOWED_MODELS)")
    return "; ".join(ways) or None


def _narrow_models(schema: dict[str, Any], policy: FormPolicy) -> None:
    choices = [(info.path, model_label(info)) for info in policy.models]
    free = _model_free_text(policy)
    for path in ("model.path", "model.tokenizer_path"):
        for field in _fields(schema, path):
            _choice(field, choices, free)


def _narrow_mlflow(schema: dict[str, Any], policy: FormPolicy) -> None:
    servers = [s for s in policy.paths.mlflow_servers if s != "*" and url_problem(s) is None]
    choices = [(LOCAL_MLFLOW_STORE, "a store in the run's own folder")] + [(s, s) for s in servers]
    free = "any MLflow server (ALLOWED_MLFLOW_SERVERS is *)" if "*" in policy.paths.mlflow_servers else None
    for field in _fields(schema, "logging.mlflow.tracking_uri"):
        _choice(field, choices, free)
        field["description"] = "empty: the run's own store; else a store in its folder or an allowed server"


def _narrow_rewards(schema: dict[str, Any], policy: FormPolicy) -> None:
    if not policy.plugins:
        return  # the schema's enum: the built-ins
    choices = [(name, name) for name in config_names.REWARDS.names] + list(policy.plugins)
    for definition in ("RewardConfig", "RewardComponent"):
        _choice(schema["$defs"][definition]["properties"]["name"], choices, None)


def _narrow_environments(schema: dict[str, Any], policy: FormPolicy) -> None:
    """``env.name``: none, a built-in, or an offered plugin (the schema's enum: none or a built-in)."""
    if not policy.env_plugins:
        return
    choices = [(name, name) for name in config_names.builtin_environments()] + list(policy.env_plugins)
    field = schema["$defs"]["EnvConfig"]["properties"]["name"]
    field["x-choices"] = [{"value": value, "label": label} for value, label in choices]
    field["enum"] = [None, *(value for value, _ in choices)]


def _narrow_resources(schema: dict[str, Any], policy: FormPolicy) -> None:
    limits = policy.resources
    for path, limit in (
        ("resources.trainer_gpus", limits.max_gpus),
        ("resources.rollout_gpus", limits.max_gpus),
        ("resources.cpus_per_actor", limits.max_cpus_per_actor),
    ):
        for field in _fields(schema, path):
            field["maximum"] = min(field.get("maximum", limit), limit)
    names = sorted(limits.node_resources)
    for path in NODE_RESOURCES:
        if not names:
            _drop(schema, path)
            continue
        for field in _fields(schema, path):
            field["propertyNames"] = {**field.get("propertyNames", {}), "enum": names}


def _narrow_sinks(schema: dict[str, Any]) -> None:
    for field in _fields(schema, "logging.sinks"):
        field["items"]["enum"] = [s for s in field["items"]["enum"] if s not in PLATFORM_SINKS]


def _group_cluster(schema: dict[str, Any]) -> None:
    for path in CLUSTER_FIELDS:
        for field in _fields(schema, path):
            field["x-group"] = CLUSTER


def narrowed_schema(policy: FormPolicy, *, project_id: int | None = None) -> dict[str, Any]:
    """The engine's JSON Schema as ``policy`` narrows it (see the module's docstring)."""
    schema = copy.deepcopy(experiment_json_schema())
    if not policy.allow_remote_code:
        _drop(schema, "model.trust_remote_code")
    if not policy.paths.allow_downloads:
        _drop(schema, "data.allow_download")
    _drop(schema, "data.cache_dir")
    if not policy.paths.model_roots:  # a tiny model is built in the project's folder under the first one
        _drop(schema, "model.tiny")
    if not policy.paths.data_roots:  # likewise a synthetic dataset
        _drop(schema, "data.synthetic")
    _narrow_sinks(schema)
    _narrow_models(schema, policy)
    _narrow_mlflow(schema, policy)
    _narrow_rewards(schema, policy)
    _narrow_environments(schema, policy)
    _narrow_resources(schema, policy)
    _group_cluster(schema)
    schema["x-platform"] = {"project": project_id}
    return schema

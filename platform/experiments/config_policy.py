"""What a config that comes through the platform may ask of the cluster (docs/api.md, "Trust boundary").

The engine's own CLI trusts its user; the platform runs configs of any project member on a shared
cluster, so it narrows them:

- ``model.path`` / ``model.tokenizer_path``: one of ``ALLOWED_MODELS`` (verbatim) or a path under
  ``MODEL_ROOTS``; ``data.path``: a path under ``DATA_ROOTS``. Relative paths count from the engine's
  working directory (where the job runs), ``..`` and symlinks are resolved before the check.
- ``trainer.checkpoint_dir``, ``trainer.resume_from`` and ``pipeline.ray_address`` belong to the
  platform: the launcher gives every run its own checkpoint folder, resume goes through the resume
  endpoint (from a checkpoint of a run of the same project), and a run joins the cluster it was
  submitted to. ``logging.jsonl_path`` is a file name the launcher places in the run's own folder.
- ``model.trust_remote_code`` only in projects an administrator has allowed it for.

Violations are :class:`ConfigError` with field paths, i.e. HTTP 400s naming the field.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from experiments.run_files import CHECKPOINTS, checkpoint_folder, is_inside
from rl_engine.config import ConfigError
from rl_engine.presets import get_preset, preset_names

if TYPE_CHECKING:
    from accounts.models import Project
    from tracking.models import Checkpoint

JSONL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.jsonl$")


@dataclass(frozen=True)
class PathPolicy:
    model_roots: tuple[Path, ...]
    data_roots: tuple[Path, ...]
    allowed_models: frozenset[str]
    workdir: Path  # the engine job's working directory: relative paths count from there

    @classmethod
    def from_settings(cls) -> PathPolicy:
        workdir = getattr(settings, "ENGINE_WORKDIR", "") or settings.BASE_DIR
        return cls(
            model_roots=tuple(Path(p) for p in settings.MODEL_ROOTS),
            data_roots=tuple(Path(p) for p in settings.DATA_ROOTS),
            allowed_models=frozenset(settings.ALLOWED_MODELS),
            workdir=Path(workdir),
        )

    def under(self, value: str, roots: tuple[Path, ...]) -> bool:
        path = value if os.path.isabs(value) else str(self.workdir / value)
        return any(is_inside(path, root) for root in roots)

    def model_ok(self, value: str) -> bool:
        return value in self.allowed_models or self.under(value, self.model_roots)


def _roots(roots: tuple[Path, ...]) -> str:
    return ", ".join(str(r) for r in roots) or "(none configured)"


OWNED_BY_PLATFORM = {
    "trainer.checkpoint_dir": "is set by the platform: every run checkpoints into its own folder; "
    "leave it empty (null)",
    "trainer.resume_from": "is set by the platform: to continue a finished run, use "
    "POST /api/runs/{id}/resume; leave it empty (null)",
    "pipeline.ray_address": "is set by the platform: a run joins the cluster the launcher submits it to; "
    "leave it empty (null)",
}
JSONL_NAME_RULE = "must be a file name ending in .jsonl (e.g. metrics.jsonl): the platform writes it into the run's own folder"
REMOTE_CODE_RULE = (
    "this project may not run code shipped with a model; an administrator can allow it for the project "
    "(admin: Projects, 'allow trust_remote_code')"
)


def _path_violations(config: dict[str, Any], policy: PathPolicy) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    model = config.get("model") or {}
    names = ", ".join(sorted(policy.allowed_models)) or "none"
    for field in ("path", "tokenizer_path"):
        value = model.get(field)
        if value is not None and not policy.model_ok(str(value)):
            where = f"under {_roots(policy.model_roots)} (MODEL_ROOTS) or an allowed model ({names})"
            out.append((f"model.{field}", f"{value!r} is not allowed here: use a model directory {where}"))
    data = config.get("data") or {}
    if data.get("source") == "jsonl" and not policy.under(str(data.get("path") or ""), policy.data_roots):
        where = f"under {_roots(policy.data_roots)} (DATA_ROOTS)"
        out.append(("data.path", f"{data.get('path')!r} is not allowed here: use a file {where}"))
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
    out = _path_violations(config, policy or PathPolicy.from_settings())
    out += _platform_field_violations(config, resume_from)
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


def launch_config(config: dict[str, Any], *, folder: Path, resume_from: str | None) -> dict[str, Any]:
    """The config a run's job gets: the platform's fields set whatever the stored config says (a config
    stored before this policy, or edited in the admin, cannot point a run elsewhere)."""
    out = without_platform_fields(config)
    out["trainer"].update(checkpoint_dir=str(folder / CHECKPOINTS), resume_from=resume_from)
    logging_cfg = out.setdefault("logging", {})
    if logging_cfg.get("jsonl_path"):
        logging_cfg["jsonl_path"] = str(folder / Path(str(logging_cfg["jsonl_path"])).name)
    return out


def platform_preset(name: str) -> dict[str, Any]:
    """The engine's preset as this platform accepts it: a tiny model is built under the first model
    root (the engine's own default, ``var/models/...``, counts from the working directory)."""
    config = get_preset(name)
    model = config.get("model") or {}
    roots = settings.MODEL_ROOTS
    if model.get("tiny") is not None and roots:
        model["path"] = str(Path(roots[0]) / Path(str(model["path"])).name)
    return config


def platform_presets() -> dict[str, dict[str, Any]]:
    return {name: platform_preset(name) for name in preset_names()}

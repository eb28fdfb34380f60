"""A config from YAML text or a file (or an engine preset), ``--set a.b=c`` overrides, and back to YAML."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from rl_engine.config.errors import ConfigError
from rl_engine.config.experiment import ExperimentConfig
from rl_engine.config.validation import parse_config
from rl_engine.presets import UnknownPreset, get_preset


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=c`` -> (['a', 'b'], value); the value is parsed as YAML (numbers, bools, lists)."""
    if "=" not in item:
        raise ConfigError([("", f"override {item!r} must look like key.path=value")])
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError([("", f"override {item!r} has an empty key")])
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with ``a.b=c`` overrides applied (creates missing mappings)."""
    if overrides and not isinstance(data, dict):
        raise ConfigError([("", f"the config must be a mapping, got {type(data).__name__}")])
    out = copy.deepcopy(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(
                    [(".".join(path), f"cannot set a field inside {part!r}, which is not a mapping")]
                )
            node = child
        node[path[-1]] = value
    return out


# What a fork (a run that starts from another run's checkpoint with a changed config) may not change:
# the checkpoint's weights and optimizer state load only into the same model, and its pipeline state


def read_yaml(path: str | Path) -> Any:
    """The document of a YAML file, or a preset's (``preset:NAME``); ConfigError when unreadable."""
    text_path = str(path)
    if text_path.startswith("preset:"):
        try:
            return get_preset(text_path.removeprefix("preset:"))
        except UnknownPreset as exc:
            raise ConfigError([("", str(exc))]) from None
    try:
        raw = Path(path).read_text()
    except OSError as exc:
        raise ConfigError([("", f"cannot read {path}: {exc.strerror}")]) from None
    try:
        return yaml.safe_load(raw) or {}
    except yaml.YAMLError as exc:
        where = yaml_where(getattr(exc, "problem_mark", None))
        raise ConfigError([("", f"{path} is not valid YAML{where}")]) from None


def load_yaml(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load a config from a YAML file (or ``preset:NAME``) and apply overrides."""
    return parse_config(apply_overrides(read_yaml(path), overrides or []))


def yaml_where(mark: yaml.Mark | None) -> str:
    """`` (line L, column C)`` of a YAML error's position (1-based, as editors count), or ``""``."""
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""


def dump_yaml(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)

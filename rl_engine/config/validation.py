"""A plain mapping validated into an ``ExperimentConfig``, and pydantic's errors as field paths."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from rl_engine.config.errors import ConfigError, FieldError, joined, relative
from rl_engine.config.experiment import ExperimentConfig
from rl_engine.config.layout import layout
from rl_engine.config.moved import BY_PATH as MOVED_FIELDS
from rl_engine.config.moved import moved_message


def error_path(loc: tuple[Any, ...], model: type[BaseModel]) -> str:
    """pydantic's location of an error in ``model`` as a field path: ('rollout', 'hf', 'n') ->
    'rollout.n' (the tag pydantic inserts after a discriminated union is dropped, once: ('data', 'task',
    'task') -> 'data.task'), ('betas', 0) -> 'betas[0]'."""
    unions = layout(model).unions
    parts: list[str] = []
    tag_next = False
    for item in loc:
        if tag_next and isinstance(item, str) and item in unions[".".join(parts)].variants:
            tag_next = False
            continue
        parts.append(f"[{item}]" if isinstance(item, int) else str(item))
        tag_next = ".".join(parts) in unions
    return ".".join(parts).replace(".[", "[")


def _moved_field(path: str, model: type[BaseModel]) -> str | None:
    """The moved field (``rl_engine.config.moved``) an unknown field at ``path`` of ``model`` is, if any."""
    for site in layout(model).sites.get(ExperimentConfig, ()):
        inside = relative(site, path)
        if inside in MOVED_FIELDS:
            return inside
    return None


def validation_errors(exc: ValidationError, model: type[BaseModel]) -> list[tuple[str, str]]:
    """Flatten a pydantic error of ``model`` into (field.path, message) pairs: a :class:`FieldError` at
    its field, a field that moved to the placement with a message naming its new place."""
    out = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        path = error_path(tuple(err["loc"]), model)
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            path = joined(path, cause.path)
        elif err["type"] == "extra_forbidden" and (moved := _moved_field(path, model)):
            msg = moved_message(MOVED_FIELDS[moved])
        out.append((path, msg))
    return out


def parse_config(data: dict[str, Any]) -> ExperimentConfig:
    """Validate a plain dict; raises ConfigError with field paths."""
    if not isinstance(data, dict):
        raise ConfigError([("", f"the config must be a mapping, got {type(data).__name__}")])
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_errors(exc, ExperimentConfig)) from None

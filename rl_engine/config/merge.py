"""A config with a nested partial config merged in (sweeps, forks), and what a fork may not change."""

from __future__ import annotations

import copy
from typing import Any

from rl_engine.config.errors import ConfigError, joined
from rl_engine.config.experiment import ExperimentConfig
from rl_engine.config.layout import layout
from rl_engine.config.validation import parse_config

# What a fork (a run that starts from another run's checkpoint with a changed config) may not change:
# the checkpoint's weights and optimizer state load only into the same model, and its pipeline state
# only into as many rollouters as wrote it (rl_engine.pipeline.checkpoint.restore_parts).
FORK_FIXED: tuple[str, ...] = ("model", "pipeline.num_rollouters")


def merge_config(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with a nested partial config merged in: mappings merge key by key, anything
    else (numbers, strings, lists, null) replaces the value. ConfigError where ``overrides`` would set a
    field inside a value that is not a mapping.

    An override that changes a tagged section's kind (``rollout.backend``: hf -> vllm, ``data.source``:
    task -> jsonl) keeps only the section's fields the new kind has too (``n``, ``temperature``,
    ``truncation_side`` ...) and drops the old kind's own (``task_kwargs``), which it would refuse."""
    out = copy.deepcopy(data)
    unions = layout(ExperimentConfig).unions

    def merge(node: dict[str, Any], over: dict[str, Any], where: str) -> None:
        for key, value in over.items():
            path = joined(where, str(key))
            if isinstance(value, dict) and isinstance(node.get(key), dict):
                if path in unions:
                    union = unions[path]
                    kind = value.get(union.tag, node[key].get(union.tag))
                    if kind != node[key].get(union.tag) and kind in union.variants:
                        kept = union.fields_of(kind)
                        node[key] = {k: v for k, v in node[key].items() if k in kept}
                merge(node[key], value, path)
            elif isinstance(value, dict) and key in node and node[key] is not None:
                raise ConfigError([(path, f"{key!r} is not a mapping: give its value, not fields inside it")])
            else:
                node[key] = copy.deepcopy(value)

    merge(out, overrides, "")
    return out


def dotted_get(data: dict[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` of a nested dict, or None where a part is missing."""
    node: Any = data
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def fork_config(parent: ExperimentConfig, overrides: dict[str, Any]) -> ExperimentConfig:
    """``parent`` with ``overrides`` (a nested partial config) merged in and validated. ConfigError with
    field paths relative to the config's root (the overrides' own paths): an invalid value, an unknown
    field, or a change of a :data:`FORK_FIXED` field."""
    if not isinstance(overrides, dict):
        raise ConfigError([("", f"the overrides must be a mapping, got {type(overrides).__name__}")])
    base = parent.model_dump(mode="json")
    merged = merge_config(base, overrides)
    child = parse_config(merged)
    after = child.model_dump(mode="json")
    fixed: list[tuple[str, str]] = []
    for path in FORK_FIXED:
        old, new = dotted_get(base, path), dotted_get(after, path)
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            where = [joined(path, k) for k in keys]
        else:
            where = [path]
        fixed += [
            (w, "a fork keeps the parent's value: the checkpoint would not load otherwise") for w in where
        ]
    if fixed:
        raise ConfigError(fixed)
    return child

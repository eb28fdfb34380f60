"""Where reward plugins are found: the entry-point group ``rl_engine.rewards`` of the installed packages
(docs/engine.md, "Reward plugins"). Standard library only, and nothing of a plugin is imported while it
is found (:func:`load_plugin` imports one when a registry needs it): the config checks names against what this finds (``rl_engine.config.names``), the reward registry loads a
plugin when a config names it (``rl_engine.rewards.registry``).

The entry point's name is the reward's name; a name a built-in reward has (or an earlier package's
plugin) is refused: left out, with a warning and the reason (``python -m rl_engine rewards`` lists it).

Environment plugins (the group ``rl_engine.envs``, ``rl_engine.envs.plugins``) are found by the same
:func:`discover`, given their group and built-in names.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

log = logging.getLogger(__name__)

GROUP = "rl_engine.rewards"


@dataclass(frozen=True)
class PluginRefused:
    """An installed entry point that is not offered, and why."""

    name: str
    value: str  # the entry point's object reference, "package.module:factory"
    package: str
    reason: str


def plugin_package(ep: metadata.EntryPoint) -> tuple[str, str]:
    """(distribution name, version) of the package that declares ``ep`` (``?`` where unknown)."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "?", "?"
    return str(dist.metadata["Name"] or "?"), str(dist.version or "?")


@functools.cache
def discover(
    builtins: frozenset[str], group: str = GROUP, what: str = "reward"
) -> tuple[dict[str, metadata.EntryPoint], tuple[PluginRefused, ...]]:
    """(the plugins by name, the refused ones) among the installed entry points of ``group``, given the
    built-in names (``what``: a reward, an environment). Cached until :func:`refresh`."""
    found: dict[str, metadata.EntryPoint] = {}
    refused: list[PluginRefused] = []
    for ep in sorted(metadata.entry_points(group=group), key=lambda e: (e.name, e.value)):
        package = plugin_package(ep)[0]
        reason = None
        if ep.name in builtins:
            reason = f"it would shadow the built-in {what} {ep.name!r}: rename the entry point"
        elif ep.name in found:
            reason = f"package {plugin_package(found[ep.name])[0]!r} already registers a {what} {ep.name!r}"
        if reason:
            log.warning("%s plugin %r of package %r refused: %s", what, ep.name, package, reason)
            refused.append(PluginRefused(ep.name, ep.value, package, reason))
        else:
            found[ep.name] = ep
    return found, tuple(refused)


def refresh() -> None:
    """Forget what was found: the next lookup reads the installed packages again."""
    discover.cache_clear()


class PluginError(ValueError):
    """A plugin that cannot be loaded (its module raises on import, its object is no callable)."""


def load_plugin(ep: metadata.EntryPoint, what: str = "reward") -> Callable[..., Any]:
    """The object a plugin's entry point names (its module imported now: the only place a plugin's code
    is imported); PluginError (one line): it does not load, or is not callable."""
    name = ep.name
    package, version = plugin_package(ep)
    try:
        factory = ep.load()
    except Exception as exc:  # a plugin's import is its own code: any error is a plugin error
        raise PluginError(
            f"{what} plugin {name!r} ({package} {version}, {ep.value}) failed to load: "
            f"{type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    if not callable(factory):
        raise PluginError(f"{what} plugin {name!r} ({package} {version}): {ep.value} is not callable")
    return factory


def describe_factory(factory: Callable[..., Any]) -> dict[str, Any]:
    """A factory's description (its docstring's first paragraph, on one line) and parameters (name, type,
    default, required: its signature), for a catalogue: JSON-ready."""
    doc = inspect.getdoc(factory) or ""
    params = []
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        signature = None
    for p in signature.parameters.values() if signature else ():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        annotation = p.annotation
        type_text = (
            None
            if annotation is inspect.Parameter.empty
            else annotation
            if isinstance(annotation, str)
            else getattr(annotation, "__name__", None) or str(annotation)
        )
        entry: dict[str, Any] = {"name": p.name, "type": type_text, "required": p.default is p.empty}
        if p.default is not p.empty:
            entry["default"] = _json_default(p.default)
        params.append(entry)
    first = " ".join(doc.split("\n\n", 1)[0].split())  # the first paragraph, on one line
    return {"description": first, "parameters": params}


def _json_default(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_default(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_default(v) for k, v in value.items()}
    return repr(value)

"""Environment plugins: environments that installed packages register under the entry-point group
``rl_engine.envs`` (docs/engine.md, "Environments"), found as reward plugins are
(``rl_engine.reward_plugins.discover``: metadata only, nothing imported until a config names one).

The contract:

- the entry point's **name** is the environment's name (``env.name``, like a built-in's); a name a
  built-in has (or an earlier package's plugin) is refused: left out, with a warning and the reason;
- its **object** is a factory like the built-ins': ``factory(judge, **kwargs) -> Environment`` (the
  run's reward as a ``Judge``, then the config's ``env.kwargs``, checked against its signature and called
  when the config is checked: a ``ValueError`` it raises is the config's ``env.kwargs`` error);
- the **environment** answers ``step(Episode) -> EnvStep`` and is stateless (``rl_engine.envs.base``);
  an exception it raises ends its episode unscored (``env/errors``), never the run.

Standard library only (no config, no torch): the config's name check and the registry both call here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

from rl_engine.reward_plugins import PluginRefused, discover, load_plugin, refresh

GROUP = "rl_engine.envs"


def installed(builtins: Iterable[str]) -> dict[str, metadata.EntryPoint]:
    """The installed environment plugins by name (entry points, not loaded), less those that would
    shadow one of ``builtins``; cached (:func:`refresh_plugins` after installing one)."""
    return dict(discover(frozenset(builtins), GROUP, "environment")[0])


def refused(builtins: Iterable[str]) -> tuple[PluginRefused, ...]:
    """Installed entry points that are not offered, with the reason."""
    return discover(frozenset(builtins), GROUP, "environment")[1]


def load_environment_factory(ep: metadata.EntryPoint) -> Callable[..., Any]:
    """The factory the plugin's entry point names (its module imported now); ``PluginError`` (a
    ValueError, one line) when it does not load or is not callable."""
    return load_plugin(ep, "environment")


def refresh_plugins() -> None:
    """Forget what was found (reward and environment plugins): the next lookup reads the installed
    packages again."""
    refresh()

"""Reward functions behind a registry, looked up by name with keyword arguments from the config.

A reward factory takes the config's kwargs and returns ``RewardFn(sample) -> float``. Nothing here
evaluates user-supplied code: the only user-controlled inputs are plain values and (for ``format``)
a regular expression. ``build_reward`` wraps the function in ``SafeReward``.

Besides the built-ins (``REWARDS``), a name may be a reward plugin an installed package registers
(``rl_engine.rewards.plugins``): the operator's code, imported when a config naming it is checked, run
with ``reward.timeout_s`` per call.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any, Protocol

from rl_engine.reward_plugins import PluginRefused, describe_factory, discover, plugin_package
from rl_engine.rewards.base import DEFAULT_TIMEOUT_S, RewardFn, SafeReward, WeightedSum
from rl_engine.rewards.math_answers import math_verify_reward
from rl_engine.rewards.plugins import PluginError, load_factory
from rl_engine.rewards.reasoning_gym import reasoning_gym_reward
from rl_engine.rewards.remote import http_reward
from rl_engine.rewards.reward_model import model_reward
from rl_engine.rewards.text_answers import contains, exact_match, format_match, numeric_answer

REWARDS: dict[str, Callable[..., RewardFn]] = {
    "exact_match": exact_match,
    "contains": contains,
    "numeric_answer": numeric_answer,
    "format": format_match,
    "math_verify": math_verify_reward,
    "reasoning_gym": reasoning_gym_reward,
    "http": http_reward,
    "model": model_reward,
}


def reward_names() -> list[str]:
    """The built-in rewards' names (``plugin_names()``: the installed plugins')."""
    return sorted(REWARDS)


def _plugins() -> tuple[dict[str, metadata.EntryPoint], tuple[PluginRefused, ...]]:
    return discover(frozenset(REWARDS))


def plugin_names() -> list[str]:
    """The installed reward plugins' names (``rl_engine.reward_plugins``; none shadows a built-in)."""
    return sorted(_plugins()[0])


def is_plugin(name: str) -> bool:
    return name not in REWARDS and name in _plugins()[0]


def plugin_entry_point(name: str) -> metadata.EntryPoint:
    """The entry point of the installed plugin ``name``; KeyError if there is none."""
    return _plugins()[0][name]


def refused_plugins() -> tuple[PluginRefused, ...]:
    return _plugins()[1]


def reward_factory(name: str) -> Callable[..., Any]:
    """The factory of the built-in reward or installed plugin ``name``; ValueError (one line) for a name
    that is neither, or a plugin that does not load."""
    factory = REWARDS.get(name)
    if factory is not None:
        return factory
    if is_plugin(name):
        try:
            return load_factory(plugin_entry_point(name))
        except PluginError as exc:
            raise ValueError(str(exc)) from None
    plugins = plugin_names()
    extra = f"; installed plugins: {', '.join(plugins)}" if plugins else ""
    raise ValueError(f"unknown reward {name[:80]!r}; choose one of {', '.join(reward_names())}{extra}")


def bound_reward(name: str, kwargs: dict[str, Any]) -> RewardFn:
    """The reward ``name`` built with ``kwargs``: ValueError (one line) for an unknown name, an argument
    it does not take, or a value it refuses (a range, a type, a pattern RE2 does not accept). The config
    calls this when it is checked (``RewardConfig``), so the platform answers a 400 at create instead of
    the job failing later."""
    factory = reward_factory(name)
    sig = inspect.signature(factory)
    try:
        sig.bind(**kwargs)
    except TypeError as exc:
        params = ", ".join(sig.parameters) or "none"
        got = ", ".join(repr(k[:80]) for k in sorted(kwargs)[:20])
        raise ValueError(
            f"reward {name!r} got arguments [{got}] ({str(exc)[:200]}); it takes: {params}"
        ) from None
    try:
        fn = factory(**kwargs)
    except TypeError as exc:  # a value of the wrong type met an operator or a comparison
        raise ValueError(f"reward {name!r}: an argument has the wrong type ({exc})") from None
    if not callable(fn):
        raise ValueError(f"reward {name!r}: its factory returned {type(fn).__name__}, not a function")
    return fn


def safe_reward(name: str, kwargs: dict[str, Any], key: str, timeout_s: float | None) -> SafeReward:
    """``bound_reward`` in its ``SafeReward`` named ``key``: a plugin with the per-call ``timeout_s``
    (run in a worker thread), a built-in inline."""
    return SafeReward(bound_reward(name, kwargs), key, timeout_s=timeout_s if is_plugin(name) else None)


def reward_catalogue() -> dict[str, Any]:
    """Every reward this environment offers, JSON-ready (``python -m rl_engine rewards --json``, which the
    platform reads): ``rewards``: name, description (the factory's docstring's first line), parameters
    (name, type, default, required: its signature), origin (``builtin`` or ``plugin``, with the package
    and version); a plugin that does not load carries ``error``. ``refused``: entry points not offered
    (a name that shadows a built-in), with the reason. Loading the plugins imports them."""
    rewards: list[dict[str, Any]] = []
    for name, factory in REWARDS.items():
        rewards.append({"name": name, **describe_factory(factory), "origin": "builtin"})
    for name in plugin_names():
        ep = plugin_entry_point(name)
        package, version = plugin_package(ep)
        entry: dict[str, Any] = {"name": name, "description": "", "parameters": []}
        try:
            entry.update(describe_factory(load_factory(ep)))
        except PluginError as exc:
            entry["error"] = str(exc)
        rewards.append({**entry, "origin": "plugin", "package": package, "version": version})
    refused = [
        {"name": r.name, "package": r.package, "entry_point": r.value, "reason": r.reason}
        for r in refused_plugins()
    ]
    return {"rewards": rewards, "refused": refused}


class ComponentSpec(Protocol):
    """One component of ``reward.combine`` (``rl_engine.config.RewardComponent``)."""

    name: str
    kwargs: dict[str, Any]
    weight: float

    @property
    def key(self) -> str: ...


class RewardSpec(Protocol):
    """What names a reward: ``rl_engine.config.RewardConfig`` (the config checks its arguments with
    ``bound_reward``, so this package imports nothing of the config's)."""

    name: str
    kwargs: dict[str, Any]
    combine: Sequence[ComponentSpec] | None
    timeout_s: float


def build_reward(reward_cfg: RewardSpec) -> SafeReward | WeightedSum:
    """Look up ``reward_cfg.name`` and bind ``reward_cfg.kwargs`` (``bound_reward``); the function comes
    back wrapped in ``SafeReward``. With ``reward_cfg.combine``: a ``WeightedSum`` of its components,
    each built the same way. A plugin's calls are cut off after ``reward_cfg.timeout_s``."""
    combine = getattr(reward_cfg, "combine", None)
    timeout_s = getattr(reward_cfg, "timeout_s", None) or DEFAULT_TIMEOUT_S
    if combine:
        return WeightedSum(
            [
                (part.key, float(part.weight), safe_reward(part.name, part.kwargs, part.key, timeout_s))
                for part in combine
            ]
        )
    return safe_reward(reward_cfg.name, reward_cfg.kwargs, reward_cfg.name, timeout_s)

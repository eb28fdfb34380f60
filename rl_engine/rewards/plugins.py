"""Reward plugins: rewards that installed packages register under the entry-point group
``rl_engine.rewards`` (docs/engine.md, "Reward plugins").

The contract, typed below:

- the entry point's **name** is the reward's name (a config names it like a built-in, also inside
  ``reward.combine``); a name a built-in has is refused (the plugin is not offered, and a warning says so);
- its **object** is a factory like the built-ins (:class:`RewardFactory`): the config's ``kwargs`` as keyword
  arguments, checked against its signature and called when the config is parsed (a ``TypeError`` or
  ``ValueError`` it raises is the config's field error), returning the reward function;
- the **function** (:class:`PluginRewardFn`) takes the :class:`~rl_engine.types.Sample` (``prompt_text``,
  ``response_text``, ``answer``, ``metadata``; read-only) and returns a float, or a mapping with ``score``
  (a float) and extra named figures (finite floats, names as a component label's): each figure becomes
  the step metric ``reward/<name>/<figure>/mean`` (``<name>``: the reward's name, or its ``combine``
  label);
- it runs in ``SafeReward`` with ``reward.timeout_s``: an exception, a non-finite value, a malformed
  mapping or no answer in time scores the sample as an error (``reward/errors``; ``reward/timeouts``).

Finding plugins is ``rl_engine.reward_plugins``'s (metadata only); :func:`load_factory` imports one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any, Protocol

from rl_engine.reward_plugins import PluginError, describe_factory, load_plugin
from rl_engine.types import Sample

# What a reward function may return: a score, or a score with named figures ({"score": 1.0, "parsed": 1.0}).
RewardValue = float | Mapping[str, float]


class PluginRewardFn(Protocol):
    """A plugin's reward function: one sample in, a score (or a mapping with ``score``) out."""

    def __call__(self, sample: Sample, /) -> RewardValue: ...


class RewardFactory(Protocol):
    """What a plugin's entry point names: keyword arguments (the config's ``reward.kwargs``) in, the
    reward function out. Its signature is the reward's parameters (``python -m rl_engine rewards``)."""

    def __call__(self, **kwargs: Any) -> PluginRewardFn: ...


def load_factory(ep: metadata.EntryPoint) -> Callable[..., PluginRewardFn]:
    """The factory a plugin's entry point names (its module imported now); PluginError (one line): it
    does not load, or is not callable."""
    return load_plugin(ep, "reward")


__all__ = [
    "PluginError",
    "PluginRewardFn",
    "RewardFactory",
    "RewardValue",
    "describe_factory",
    "load_factory",
]

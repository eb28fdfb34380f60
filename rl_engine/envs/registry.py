"""The environments, by the name ``env.name`` gives (a registry like the rollout backends' and the
rewards'): each a factory taking the run's ``Judge`` and the config's ``env.kwargs``; besides the
built-ins (``ENVIRONMENTS``), a name may be an installed plugin's (``rl_engine.envs.plugins``).

``build_episode_worker`` wraps a rollout worker for a config with an environment;
``build_episode_reward`` is the run's reward then: the environment's own reward of an episode where it
gives one, else the configured reward of the episode's last policy turn.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from rl_engine.envs.base import Environment, Episode, Judge
from rl_engine.envs.calculator import calculator
from rl_engine.envs.episodes import META, REWARD, EpisodeWorker
from rl_engine.envs.feedback import answer_feedback
from rl_engine.envs.openai_bridge import openai_feedback
from rl_engine.envs.plugins import installed, load_environment_factory, refused
from rl_engine.envs.textarena_games import textarena
from rl_engine.reward_plugins import plugin_package
from rl_engine.types import Sample

ENVIRONMENTS: dict[str, Callable[..., Environment]] = {
    "answer_feedback": answer_feedback,
    "calculator": calculator,
    "textarena": textarena,
    "openai_feedback": openai_feedback,
}


def _no_judge(episode: Episode, text: str) -> float:
    raise RuntimeError("a config check builds the environment without a judge")


def bound_environment(name: str, kwargs: dict[str, Any], judge: Judge = _no_judge) -> Environment:
    """The environment ``name`` built with ``kwargs``: ValueError (one line) for an unknown name, an
    argument it does not take, or a value it refuses. The config calls this when it is checked."""
    factory = environment_factory(name)
    if "judge" in kwargs:
        raise ValueError("judge is the run's reward: set it in the reward section")
    sig = inspect.signature(factory)
    try:
        sig.bind(judge, **kwargs)
    except TypeError as exc:
        params = ", ".join(p for p in sig.parameters if p != "judge") or "none"
        raise ValueError(f"environment {name!r}: {exc}; it takes: {params}") from None
    return factory(judge, **kwargs)


def environment_factory(name: str) -> Callable[..., Environment]:
    """The factory of the built-in environment or installed plugin ``name`` (a plugin's module is
    imported now); ValueError (one line) for a name that is neither, or a plugin that does not load."""
    factory = ENVIRONMENTS.get(name)
    if factory is not None:
        return factory
    plugins = installed(ENVIRONMENTS)
    if name in plugins:
        return load_environment_factory(plugins[name])
    extra = f"; installed plugins: {', '.join(sorted(plugins))}" if plugins else ""
    raise ValueError(
        f"unknown environment {name[:80]!r}; choose one of {', '.join(sorted(ENVIRONMENTS))}{extra}"
    )


def judge_of(reward_fn: Callable[[Sample], float]) -> Judge:
    """The run's reward as a judge of one policy turn: the turn's text scored as a response to the
    episode's prompt."""

    def judge(episode: Episode, text: str) -> float:
        turn = Sample(
            prompt_uid="turn",
            group_id="turn",
            prompt_ids=[],
            response_ids=[],
            logprobs=[],
            finish_reason="stop",
            param_version_start=0,
            param_version_end=0,
            prompt_text=episode.prompt_text,
            response_text=text,
            answer=episode.answer,
            metadata=dict(episode.metadata),
        )
        return float(reward_fn(turn))

    return judge


def build_episode_worker(worker: Any, cfg: Any, reward_fn: Callable[[Sample], float]) -> EpisodeWorker:
    env = bound_environment(cfg.env.name, cfg.env.kwargs, judge_of(reward_fn))
    return EpisodeWorker(
        worker,
        env,
        max_turns=cfg.env.max_turns,
        max_tokens=cfg.rollout.max_new_tokens,
        max_turn_tokens=cfg.env.max_turn_tokens,
        step_timeout_s=cfg.env.step_timeout_s,
    )


class EpisodeReward:
    """The run's reward when it has an environment: ``extra["env/reward"]`` where the environment gave
    one, else ``reward_fn`` on the episode's last policy turn."""

    def __init__(self, reward_fn: Callable[[Sample], float]):
        self.reward_fn = reward_fn

    def __call__(self, sample: Sample) -> float:
        if REWARD in sample.extra:
            return float(sample.extra[REWARD])
        final = (sample.metadata.get(META) or {}).get("final")
        return float(self.reward_fn(sample if final is None else _with_response(sample, final)))

    def stats(self) -> dict[str, float]:
        stats = getattr(self.reward_fn, "stats", None)
        return stats() if stats is not None else {}


def _with_response(sample: Sample, text: str) -> Sample:
    from dataclasses import replace

    return replace(sample, response_text=text, extra=sample.extra)


def environment_names() -> Sequence[str]:
    """The built-in environments' names (``plugin_names()``: the installed plugins')."""
    return sorted(ENVIRONMENTS)


def environment_catalogue() -> dict[str, Any]:
    """Every environment this Python environment offers, JSON-ready (``python -m rl_engine envs --json``,
    which the platform's form reads): ``envs``: name, description (a built-in's factory docstring's
    first paragraph), origin (``builtin``, or ``plugin`` with the package and version: read from the
    metadata, nothing imported); ``refused``: entry points not offered, with the reason."""
    envs: list[dict[str, Any]] = []
    for name, factory in sorted(ENVIRONMENTS.items()):
        summary = " ".join(inspect.cleandoc(factory.__doc__ or "").split("\n\n")[0].split())
        envs.append({"name": name, "description": summary, "origin": "builtin"})
    for name, ep in sorted(installed(ENVIRONMENTS).items()):
        package, version = plugin_package(ep)
        envs.append(
            {"name": name, "description": "", "origin": "plugin", "package": package, "version": version}
        )
    refused_eps = [
        {"name": r.name, "package": r.package, "entry_point": r.value, "reason": r.reason}
        for r in refused(ENVIRONMENTS)
    ]
    return {"envs": envs, "refused": refused_eps}


def plugin_names() -> Sequence[str]:
    """The installed environment plugins' names (entry-point group ``rl_engine.envs``)."""
    return sorted(installed(ENVIRONMENTS))

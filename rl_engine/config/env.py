"""``env``: multi-turn episodes with an environment (docs/engine.md, "Environments"; pydantic, no torch).

Unset (``name: null``, the default) a rollout is one prompt and one response. With a name (a built-in,
or an installed plugin's: entry-point group ``rl_engine.envs``), each sample is an episode: the policy
answers, the environment replies, up to ``max_turns`` policy turns, the whole episode (the
environment's tokens included) within ``rollout.max_new_tokens``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from rl_engine.config.errors import FieldError
from rl_engine.config.strict import StrictModel

# rl_engine.envs.registry.ENVIRONMENTS (a test keeps them equal)
ENV_NAMES = ("answer_feedback", "calculator", "textarena", "openai_feedback")


class EnvConfig(StrictModel):
    """An environment the policy talks with, turn by turn; none: single-turn rollouts."""

    name: str | None = Field(
        None,
        description="An environment (answer_feedback, calculator, textarena, openai_feedback); empty: one prompt, one response.",
        json_schema_extra={"enum": [None, *ENV_NAMES]},
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="The environment's arguments.")
    max_turns: int = Field(4, ge=1, le=64, description="Policy turns per episode at most.")
    step_timeout_s: float = Field(
        30.0,
        gt=0.0,
        le=3600.0,
        description="An environment step that has not answered by then ends its episode unscored.",
    )
    max_turn_tokens: int | None = Field(
        None,
        ge=1,
        le=131072,
        description="New tokens per policy turn at most; empty: rollout.max_new_tokens.",
    )

    @field_validator("name")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is None or value in ENV_NAMES:
            return value
        from rl_engine.envs.plugins import installed  # standard library only: entry points' metadata

        plugins = installed(ENV_NAMES)
        if value in plugins:
            return value
        shown = value if len(value) <= 80 else f"{value[:80]}..."
        extra = f"; installed plugins: {', '.join(sorted(plugins))}" if plugins else ""
        raise ValueError(f"unknown environment {shown!r}; choose one of {', '.join(ENV_NAMES)}{extra}")

    @model_validator(mode="after")
    def _kwargs_fit(self) -> EnvConfig:
        if self.name is None:
            if self.kwargs:
                raise ValueError("env.kwargs without env.name: name the environment")
            return self
        from rl_engine.envs.registry import bound_environment  # the registry reads no config

        try:
            bound_environment(self.name, self.kwargs)
        except ValueError as exc:
            raise FieldError("kwargs", str(exc)) from None
        return self

"""The environment contract: what an environment sees of an episode, and what it answers.

An environment is **stateless**: its answer is a function of the episode so far (:class:`Episode`: the
prompt's text, reference answer and metadata, and the turns taken), never of memory kept between calls.
So an episode can stop anywhere (partial rollout, a checkpoint, a weight update between turns) and
continue in another process with the same answers: what the episode is lives in its ``Sample``.

One step: the policy has finished a turn; the environment answers with :class:`EnvStep`: either the next
message (a user's reply, a tool's result) and the episode goes on, or ``done`` with the episode's reward
(``None``: the environment gives none and the run's reward scores the episode).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Role = Literal["user", "tool"]


@dataclass(frozen=True)
class Episode:
    """An episode so far: the prompt and the alternating turns (``policy[i]`` answered ``replies[i - 1]``;
    ``policy`` has one more entry than ``replies``: the environment answers the last policy turn)."""

    prompt_text: str
    answer: str
    metadata: dict[str, Any]
    policy: tuple[str, ...]  # the policy's turns, decoded, in order
    replies: tuple[str, ...] = ()  # the environment's messages between them
    # the episode's own name, unique in the run (EpisodeWorker gives it): what an environment that keeps
    # something per episode (an agent's thread: rl_engine.envs.openai_bridge) keys it by
    id: str = ""

    @property
    def turn(self) -> int:
        """The number of policy turns taken (1 after the first answer)."""
        return len(self.policy)


@dataclass(frozen=True)
class EnvStep:
    """The environment's answer to the last policy turn."""

    done: bool
    message: str = ""  # the next message when not done
    role: Role = "user"
    reward: float | None = None  # the episode's reward when done (None: the run's reward scores it)
    # named per-episode figures (metrics ``env/<name>``), of the episode so far: those of the step that
    # ends it (done, or cut by a budget after this step) are kept
    figures: dict[str, float] = field(default_factory=dict)


class Environment(Protocol):
    """What an environment plugin's factory returns (``rl_engine.envs.registry``)."""

    def step(self, episode: Episode, /) -> EnvStep: ...


# A judge: the run's reward applied to one policy turn (text in, score out): how an environment that
# checks answers (answer_feedback) uses the configured reward without knowing which one it is.
Judge = Callable[[Episode, str], float]

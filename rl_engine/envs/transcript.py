"""An episode as a conversation, for its example in the sample browser: the policy's turns and the
environment's messages in order, each with its tokens and (a policy turn's) mean behaviour log-prob.

Read from what the episode's sample holds (``EpisodeWorker``: the spans the environment wrote, its
messages and their roles, the policy's turns decoded when the episode ended), bounded as the wire bounds
them (``types.MAX_SAMPLE_TURNS`` turns, ``types.MAX_TURN_TEXT`` characters each: a longer text is cut, and
says so) and as the platform stores them (a NUL or a lone surrogate in a decoded turn repaired).
"""

from __future__ import annotations

import math
from typing import Any

from rl_engine.envs.episodes import META
from rl_engine.safe_json import json_repaired
from rl_engine.types import MAX_SAMPLE_TURNS, MAX_TURN_TEXT, ExampleTurn, Sample

POLICY_ROLE = "assistant"
ENV_ROLES = ("user", "tool")  # rl_engine.envs.base.Role
_MARK_ROOM = 40  # characters kept free for the mark a cut text ends with


def episode_turns(sample: Sample) -> list[ExampleTurn] | None:
    """The turns of ``sample``'s episode (module docstring); None for a single-turn sample or an episode
    that has not ended."""
    state: dict[str, Any] = sample.metadata.get(META) or {}
    policy = state.get("policy")
    if not isinstance(policy, list) or not policy:
        return None
    spans = [(int(a), int(b)) for a, b in state.get("spans", [])]
    replies = list(state.get("replies", []))
    # an episode from before roles were recorded, or a role outside the contract's: shown as a user's
    roles = [r if r in ENV_ROLES else "user" for r in state.get("roles", [])]
    roles += ["user"] * (len(replies) - len(roles))
    turns: list[ExampleTurn] = []
    cursor = 0
    for i, text in enumerate(policy):
        end = spans[i][0] if i < len(spans) else len(sample.response_ids)
        turns.append(_turn(POLICY_ROLE, text, end - cursor, sample.logprobs[cursor:end]))
        if i < len(spans):
            start, cursor = spans[i]
            if i < len(replies):
                turns.append(_turn(roles[i], replies[i], cursor - start, None))
    return turns[:MAX_SAMPLE_TURNS]


def _turn(role: str, text: str, tokens: int, logprobs: list[float] | None) -> ExampleTurn:
    text = json_repaired(str(text))  # what the platform stores: no NUL, no lone surrogate
    if len(text) > MAX_TURN_TEXT:
        kept = MAX_TURN_TEXT - _MARK_ROOM
        text = f"{text[:kept]} … [{len(text) - kept} more characters]"
    mean = math.fsum(logprobs) / len(logprobs) if logprobs else None
    return ExampleTurn(
        role=role,
        text=text,
        tokens=max(0, tokens),
        logprob_mean=mean if mean is not None and math.isfinite(mean) else None,
    )

"""Typed messages that flow between the engine's parts (no torch/ray import: plain Python lists)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class Prompt:
    """One prompt to answer. ``uid`` is unique within a run and deterministic from the data position."""

    uid: str
    token_ids: list[int]
    text: str
    answer: str
    index: int  # position in the prompt stream (data position for resume)
    metadata: dict[str, Any] = field(default_factory=dict)  # dataset columns named in data.columns.metadata


@dataclass
class Sample:
    """One response to one prompt, as produced by a rollout worker and scored by the rollouter.

    ``logprobs[i]`` is the behaviour log-prob of ``response_ids[i]`` under the sampling distribution
    (logits / temperature) of the weights that generated that token. With partial rollout a response
    may span several weight versions: ``param_version_start`` <= ``param_version_end``.
    Staleness at consumption = trainer version - ``param_version_start``.
    """

    prompt_uid: str
    group_id: str  # samples of one prompt share it; advantages are normalised within a group
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    param_version_start: int
    param_version_end: int
    prompt_text: str = ""
    response_text: str = ""
    answer: str = ""
    reward: float = 0.0
    gen_time_s: float = 0.0
    num_interruptions: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)  # the prompt's metadata (rewards may read it)

    @property
    def response_length(self) -> int:
        return len(self.response_ids)


def split_groups(samples: list[Sample]) -> list[list[Sample]]:
    """Group consecutive samples by ``group_id`` (workers return them grouped by prompt)."""
    groups: list[list[Sample]] = []
    for s in samples:
        if groups and groups[-1][0].group_id == s.group_id:
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups

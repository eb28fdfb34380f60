"""Sample bookkeeping shared by every backend: new samples, resumed prefixes, finish reasons."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rl_engine.types import FinishReason, Prompt, Sample


def sample_template(prompt: Prompt, version: int) -> Sample:
    """An empty response to ``prompt`` started at policy ``version`` (group id = prompt uid)."""
    return Sample(
        prompt_uid=prompt.uid,
        group_id=prompt.uid,
        prompt_ids=list(prompt.token_ids),
        response_ids=[],
        logprobs=[],
        finish_reason="abort",
        param_version_start=version,
        param_version_end=version,
        prompt_text=prompt.text,
        answer=prompt.answer,
        metadata=dict(prompt.metadata),
    )


def needs_continuation(sample: Sample, max_new_tokens: int, max_turn_tokens: int | None = None) -> bool:
    return sample.finish_reason == "abort" and call_budget(sample, max_new_tokens, max_turn_tokens) > 0


def call_budget(sample: Sample, max_new_tokens: int, max_turn_tokens: int | None = None) -> int:
    """New tokens ``sample`` may still get: what is left of ``max_new_tokens`` for the whole response
    and, in a multi-turn episode (``max_turn_tokens``, a worker knob ``rl_engine.envs`` sets), of its
    current turn, which began at ``sample.turn_start``."""
    done = len(sample.response_ids)
    budget = max_new_tokens - done
    if max_turn_tokens is not None:
        budget = min(budget, max_turn_tokens - (done - sample.turn_start))
    return budget


def eos_floor(min_new_tokens: int, done: int, budget: int) -> int:
    """New tokens of a call during which eos may not be sampled: what is left of the response's
    ``min_new_tokens`` after the ``done`` tokens it already has, within this call's ``budget``."""
    return max(0, min(min_new_tokens - done, budget))


def extend_sample(
    sample: Sample,
    new_ids: list[int],
    new_logprobs: list[float],
    finish: FinishReason,
    *,
    version: int,
    elapsed_s: float,
    tokenizer: Any,
) -> Sample:
    """``sample`` with ``new_ids`` appended (a fresh response or the continuation of an aborted one).

    ``param_version_end`` moves to ``version`` only when tokens were added by it; every abort counts
    as one interruption.
    """
    ids = sample.response_ids + list(new_ids)
    return replace(
        sample,
        response_ids=ids,
        logprobs=sample.logprobs + [float(x) for x in new_logprobs],
        finish_reason=finish,
        param_version_end=version if new_ids else sample.param_version_end,
        response_text=tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else "",
        gen_time_s=sample.gen_time_s + elapsed_s,
        num_interruptions=sample.num_interruptions + (finish == "abort"),
    )


def normalise_finish(reason: str | None, last_token: int | None, eos_ids: list[int]) -> FinishReason:
    """Map an engine's finish reason onto stop | length | abort (None means still running: abort)."""
    if reason in ("stop", "eos", "stop_token") or (last_token is not None and last_token in eos_ids):
        return "stop"
    if reason == "length":
        return "length"
    return "abort"

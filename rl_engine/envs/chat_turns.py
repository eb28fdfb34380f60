"""The tokens an environment's message adds between two policy turns, from the model's chat template.

A multi-turn episode is one token sequence: the prompt, the policy's first turn as sampled, the
environment's message, the policy's next turn as sampled, ... The policy's tokens are **never decoded and
re-encoded** (a text round trip can merge or split tokens differently: the trainer would then score ids
the policy never sampled, a silent off-policy drift). Only the environment's part is tokenized, and it is
found from the template itself: the template renders a conversation once with an assistant turn that
holds a placeholder and once more with the environment's message after it; what follows the placeholder
is the end of the assistant's turn (ChatML: ``<|im_end|>\n``), the difference of the two renderings is
the new message with the next assistant header (``<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n``).
When the policy's turn ended by sampling the end-of-turn token itself, that token is already in the
sequence and is not added again. A tokenizer without a chat template gets the message on its own line.
"""

from __future__ import annotations

from typing import Any

from rl_engine.envs.base import Role

_PLACEHOLDER = "\u2063RLP-TURN\u2063"  # an invisible separator around a word no template emits


def observation_text(tokenizer: Any, message: str, role: Role, policy_stopped: bool) -> str:
    """The text between the end of a policy turn and the start of the next one (module docstring)."""
    if not getattr(tokenizer, "chat_template", None):
        return f"\n{message}\n"
    base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _PLACEHOLDER}]
    before = tokenizer.apply_chat_template(base, tokenize=False)
    after = tokenizer.apply_chat_template(
        [*base, {"role": role, "content": message}], tokenize=False, add_generation_prompt=True
    )
    cut = before.index(_PLACEHOLDER) + len(_PLACEHOLDER)
    if not after.startswith(before):  # a template that rewrites earlier turns: keep what follows the turn
        start = after.index(_PLACEHOLDER) + len(_PLACEHOLDER)
        text = after[start:]
    else:
        text = before[cut:] + after[len(before) :]
    eos = tokenizer.eos_token or ""
    if policy_stopped and eos and text.startswith(eos):
        text = text[len(eos) :]  # the policy sampled the end of its turn: it is in the sequence already
    return text


def observation_ids(tokenizer: Any, message: str, role: Role, policy_stopped: bool) -> list[int]:
    """:func:`observation_text` as token ids (no special tokens added around it)."""
    text = observation_text(tokenizer, message, role, policy_stopped)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])

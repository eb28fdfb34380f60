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

A ``tool`` message (a tool's result) is rendered as the template renders that role (ChatML templates
such as SmolLM2's: ``<|im_start|>tool\n...<|im_end|>``; Qwen2.5's: a user turn holding
``<tool_response>...</tool_response>``); a template that refuses the role (``raise_exception``) gets
it (or leaves the message out) gets it as a user message in the Hermes ``<tool_response>`` wrapping.
"""

from __future__ import annotations

from typing import Any

from jinja2 import TemplateError

from rl_engine.envs.base import Role

_PLACEHOLDER = "\u2063RLP-TURN\u2063"  # an invisible separator around a word no template emits


def observation_text(tokenizer: Any, message: str, role: Role, policy_stopped: bool) -> str:
    """The text between the end of a policy turn and the start of the next one (module docstring)."""
    if not getattr(tokenizer, "chat_template", None):
        return f"\n{message}\n"
    base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _PLACEHOLDER}]
    before = tokenizer.apply_chat_template(base, tokenize=False)
    try:
        after = _rendered(tokenizer, [*base, {"role": role, "content": message}])
    except TemplateError:  # the template's raise_exception: it refuses the role
        if role != "tool":
            raise
        after = ""
    if role == "tool" and (not after or message.strip() not in after):  # a template without a tool role
        after = _rendered(tokenizer, [*base, {"role": "user", "content": tool_response(message)}])
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


def _rendered(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The template's rendering of ``messages`` with the next assistant header."""
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def tool_response(message: str) -> str:
    """A tool's result as a user message, for a template that has no ``tool`` role: the Hermes wrapping
    (Qwen2.5's template renders a tool message so)."""
    return f"<tool_response>\n{message}\n</tool_response>"


def observation_ids(tokenizer: Any, message: str, role: Role, policy_stopped: bool) -> list[int]:
    """:func:`observation_text` as token ids (no special tokens added around it)."""
    text = observation_text(tokenizer, message, role, policy_stopped)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])

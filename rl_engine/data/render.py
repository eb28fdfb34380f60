"""From a ``Row`` to the token ids the policy sees: prompt template, chat template, length policy.

Rows that are chat messages (or any row, when the chat template is on) go through the tokenizer's
``apply_chat_template`` with the generation prompt, exactly as an instruct model expects its input;
the rendered text is then encoded without adding special tokens a second time (the template has them).
A prompt over ``max_tokens`` is dropped, truncated at a token boundary, or an error — never cut
silently: every one is counted (``overlong``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rl_engine.data.rows import DataError, Row

Overlong = Literal["drop", "truncate", "error"]


@dataclass(frozen=True)
class Rendered:
    """What the policy gets: the text shown in samples and its token ids."""

    text: str
    token_ids: list[int]
    truncated: bool = False


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


class PromptRenderer:
    """Renders rows for one tokenizer under one length policy; counts overlong prompts."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_tokens: int,
        overlong: Overlong = "drop",
        truncation_side: Literal["left", "right"] = "left",
        chat_template: Literal["auto", "on", "off"] = "off",
        prompt_template: str = "{prompt}",
        system_prompt: str | None = None,
    ):
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.overlong_policy = overlong
        self.truncation_side = truncation_side
        if chat_template == "on" and not has_chat_template(tokenizer):
            raise DataError(
                "data.chat_template is 'on' but the tokenizer has no chat template "
                "(set it to auto/off, or use an instruct model's tokenizer)"
            )
        self.use_chat = chat_template == "on" or (chat_template == "auto" and has_chat_template(tokenizer))
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.overlong = 0  # prompts over max_tokens seen (dropped or truncated)

    def messages(self, row: Row) -> list[dict[str, str]]:
        """The chat of a row: its messages, or one user turn; a system turn first when one is set."""
        if row.messages is not None:
            msgs = [dict(m) for m in row.messages]
        else:
            msgs = [{"role": "user", "content": self._templated(row)}]
        system = row.system or self.system_prompt
        if system and msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": system})
        return msgs

    def _templated(self, row: Row) -> str:
        # str.replace, not str.format: a dataset's braces (LaTeX!) must not be read as fields.
        assert row.prompt is not None
        return self.prompt_template.replace("{prompt}", row.prompt)

    def _encode(self, row: Row) -> tuple[str, list[int]]:
        if self.use_chat:
            text = self.tokenizer.apply_chat_template(
                self.messages(row), add_generation_prompt=True, tokenize=False
            )
            return text, list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if row.messages is not None:
            raise DataError(
                "a row holds chat messages but the tokenizer has no chat template to render them "
                "(use a prompt column, or a tokenizer with a chat template)"
            )
        text = self._templated(row)
        return text, list(self.tokenizer(text)["input_ids"])

    def render(self, row: Row, where: str = "prompt") -> Rendered | None:
        """The rendered prompt, or None when it is over the limit and the policy drops it."""
        text, ids = self._encode(row)
        if len(ids) <= self.max_tokens:
            return Rendered(text, ids)
        self.overlong += 1
        if self.overlong_policy == "error":
            raise DataError(
                f"{where} has {len(ids)} tokens, more than rollout.max_prompt_tokens={self.max_tokens} "
                "(raise it, or set data.overlong_prompts to drop or truncate)"
            )
        if self.overlong_policy == "drop":
            return None
        ids = ids[-self.max_tokens :] if self.truncation_side == "left" else ids[: self.max_tokens]
        # The text shown in samples is what the policy sees: decode the kept tokens.
        return Rendered(self.tokenizer.decode(ids), ids, truncated=True)

"""Final-answer rewards for math datasets, checked with Hugging Face's ``math-verify``.

``math-verify`` parses LaTeX and plain expressions into sympy and compares them symbolically, so
``\\frac{1}{2}``, ``0.5`` and ``\\boxed{\\frac{2}{4}}`` are the same answer, ``1,000`` is ``1000`` and
``10\\%`` is ``0.1``. What this module adds is where the final answer sits:

* the reference: GSM8K solutions end in ``#### 72`` (the part after the last ``####`` is the answer);
  anything else is parsed whole (a number, or LaTeX with or without ``$``);
* the response (``answer_format``): ``gsm8k`` needs ``#### <answer>``, ``boxed`` needs ``\\boxed{}``,
  ``auto`` takes ``####`` when present and otherwise lets math-verify extract the last boxed or plain
  answer.

A response whose answer is wrong but in the expected format earns ``format_reward`` (0 by default).
math-verify times its sympy work out with ``signal.alarm``, which only works in the main thread; the
rollouter scores in a worker thread, where the timeout is off and only the response's last
``max_chars`` characters are parsed (responses are bounded by ``rollout.max_new_tokens`` anyway).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Literal

from rl_engine.types import Sample

_MARKER = "####"
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


class _KnownTimeoutNotice(logging.Filter):
    """math-verify warns once per process that its timeout is off; here that is by design (see above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


def _quiet_timeout_notice() -> None:
    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _KnownTimeoutNotice) for f in logger.filters):
            logger.addFilter(_KnownTimeoutNotice())


def _after_marker(text: str) -> str | None:
    """The first line after the last ``####`` (GSM8K's answer line), or None without a marker."""
    if _MARKER not in text:
        return None
    tail = text.rsplit(_MARKER, 1)[1].strip()
    return tail.splitlines()[0].strip() if tail else ""


def _configs() -> tuple[list[Any], list[Any]]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig(), ExprExtractionConfig()], [LatexExtractionConfig(boxed_match_priority=0)]


@lru_cache(maxsize=4096)
def parse_reference(answer: str) -> tuple[Any, ...]:
    """The parsed reference answer (cached: every response to a prompt checks against the same one)."""
    from math_verify import parse

    text = _after_marker(answer)
    text = answer.strip() if text is None else text
    any_cfg, _ = _configs()
    parsed = parse(text, extraction_config=any_cfg, parsing_timeout=None)
    if not parsed and "$" not in text:  # bare LaTeX or an expression math-verify wants in math mode
        parsed = parse(f"${text}$", extraction_config=any_cfg, parsing_timeout=None)
    return tuple(parsed)


def parse_response(
    text: str, answer_format: Literal["auto", "gsm8k", "boxed"], max_chars: int, timeout_s: int | None
) -> tuple[list[Any], bool]:
    """(parsed final answer, whether the response used the expected format)."""
    from math_verify import parse

    text = text[-max_chars:]
    any_cfg, boxed_cfg = _configs()
    marked = _after_marker(text)
    if answer_format == "gsm8k" or (answer_format == "auto" and marked is not None):
        if not marked:
            return [], False
        parsed = parse(marked, extraction_config=any_cfg, parsing_timeout=timeout_s)
        return parsed, bool(parsed)
    if answer_format == "boxed":
        if not _BOXED.search(text):
            return [], False
        parsed = parse(text, extraction_config=boxed_cfg, parsing_timeout=timeout_s)
        return parsed, bool(parsed)
    parsed = parse(text, extraction_config=any_cfg, parsing_timeout=timeout_s)
    return parsed, bool(parsed)


def math_verify_reward(
    answer_format: Literal["auto", "gsm8k", "boxed"] = "auto",
    correct_reward: float = 1.0,
    format_reward: float = 0.0,
    timeout_s: int = 5,
    max_chars: int = 2000,
) -> Callable[[Sample], float]:
    """``correct_reward`` when the response's final answer equals the reference (math-verify),
    ``format_reward`` when it is wrong but in the expected format, else 0."""
    if answer_format not in ("auto", "gsm8k", "boxed"):
        raise ValueError("answer_format must be auto, gsm8k or boxed")
    if not 0.0 <= format_reward <= correct_reward:
        raise ValueError("format_reward must be between 0 and correct_reward")
    if timeout_s < 1 or max_chars < 1:
        raise ValueError("timeout_s and max_chars must be >= 1")
    try:
        import math_verify  # noqa: F401 - fail at build time, not on the first sample
    except ImportError:
        raise ValueError(
            "reward 'math_verify' needs the math-verify package (pip install math-verify)"
        ) from None
    _quiet_timeout_notice()

    def fn(sample: Sample) -> float:
        from math_verify import verify

        # signal-based timeouts only work in the main thread (see the module docstring)
        timeout = timeout_s if threading.current_thread() is threading.main_thread() else None
        gold = parse_reference(sample.answer)
        if not gold:
            raise ValueError(f"cannot parse the reference answer {sample.answer[-80:]!r}")
        got, formatted = parse_response(sample.response_text, answer_format, max_chars, timeout)
        if got and verify(list(gold), got, timeout_seconds=timeout):
            return correct_reward
        return format_reward if formatted else 0.0

    return fn

"""Rewards that compare a response with the reference answer as text: exact match, containment, the
last number, a regular expression. Each is a factory: it takes the config's kwargs and returns a
``RewardFn``."""

from __future__ import annotations

import math
import re

from rl_engine.rewards.base import RewardFn
from rl_engine.types import Sample

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _norm(text: str, strip: bool, case_sensitive: bool) -> str:
    text = text.strip() if strip else text
    return text if case_sensitive else text.lower()


def exact_match(strip: bool = True, case_sensitive: bool = True, prefix_credit: float = 0.0) -> RewardFn:
    """1.0 if the response equals the answer (after optional whitespace strip / case folding), else 0.0.

    ``prefix_credit`` (0 by default) is paid when the response starts with the answer but goes on:
    a shaping term that lets a policy learn the answer before it learns to stop right after it.
    """
    if not 0.0 <= prefix_credit <= 1.0:
        raise ValueError("prefix_credit must be between 0 and 1")

    def fn(sample: Sample) -> float:
        got = _norm(sample.response_text, strip, case_sensitive)
        want = _norm(sample.answer, strip, case_sensitive)
        if got == want:
            return 1.0
        return prefix_credit if want and got.startswith(want) else 0.0

    return fn


def contains(case_sensitive: bool = True) -> RewardFn:
    """1.0 if the answer appears anywhere in the response (a lenient shaping reward)."""

    def fn(sample: Sample) -> float:
        ans = _norm(sample.answer, True, case_sensitive)
        return float(bool(ans) and ans in _norm(sample.response_text, False, case_sensitive))

    return fn


def extract_number(text: str, marker: str | None = None) -> float | None:
    """The number after the last ``marker`` if present (e.g. GSM8K's ``####``), else the last number."""
    if marker and marker in text:
        text = text.rsplit(marker, 1)[1]
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def numeric_answer(tolerance: float = 1e-6, marker: str | None = "####") -> RewardFn:
    """1.0 if the last number in the response equals the answer's number within ``tolerance``."""
    if tolerance < 0:
        raise ValueError("tolerance must be >= 0")

    def fn(sample: Sample) -> float:
        want = extract_number(sample.answer, marker)
        got = extract_number(sample.response_text, marker)
        if want is None or got is None or not math.isfinite(got):
            return 0.0
        return float(abs(want - got) <= tolerance)

    return fn


MAX_PATTERN_CHARS = 1000


def format_match(pattern: str, full: bool = True, reward: float = 1.0) -> RewardFn:
    """``reward`` if the response matches the regular expression (whole response when ``full``), else 0.

    The pattern runs on RE2, whose matching time is linear in the response's length whatever the pattern
    (``(a+)+$`` included): a pattern a member typed cannot stall the rollouter. RE2 has no
    backreferences or lookarounds; a pattern that uses them is refused when the config is checked."""
    import re2

    if not isinstance(pattern, str) or not pattern:
        raise ValueError("pattern must be a non-empty regular expression")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"pattern is longer than {MAX_PATTERN_CHARS} characters")
    options = re2.Options()
    options.log_errors = False
    try:
        regex = re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(
            f"pattern is not a regular expression RE2 accepts (linear-time matching: no backreferences "
            f"or lookarounds): {detail}"
        ) from None
    match = regex.fullmatch if full else regex.search

    def fn(sample: Sample) -> float:
        return reward if match(sample.response_text.strip()) else 0.0

    return fn

"""Reward registry: lookups by name, kwargs from config, clear errors; math-verify answers; failing rewards."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from rl_engine.config import RewardConfig
from rl_engine.rewards import REWARDS, build_reward, reward_names
from rl_engine.types import Sample


def _s(response: str, answer: str) -> Sample:
    return Sample(
        prompt_uid="p",
        group_id="g",
        prompt_ids=[1],
        response_ids=[2],
        logprobs=[0.0],
        finish_reason="stop",
        param_version_start=0,
        param_version_end=0,
        response_text=response,
        answer=answer,
    )


def test_exact_match_with_strip_case_and_prefix_credit():
    em = build_reward(RewardConfig(name="exact_match"))
    assert em(_s(" k \n", "k")) == 1.0
    assert em(_s("kk", "k")) == 0.0
    assert em(_s("K", "k")) == 0.0
    assert (
        build_reward(RewardConfig(name="exact_match", kwargs={"case_sensitive": False}))(_s("K", "k")) == 1.0
    )
    shaped = build_reward(RewardConfig(name="exact_match", kwargs={"prefix_credit": 0.5}))
    assert [shaped(_s(r, "k")) for r in ["k", "kx", "xk", ""]] == [1.0, 0.5, 0.0, 0.0]


def test_numeric_answer_uses_marker_or_last_number():
    num = build_reward(RewardConfig(name="numeric_answer"))
    assert num(_s("so it is 1,234.0", "steps... #### 1234")) == 1.0
    assert num(_s("first 3 then 5", "5")) == 1.0
    assert num(_s("#### 4 and later 7", "4")) == 0.0  # the last number after the last marker is 7
    assert num(_s("no number", "4")) == 0.0
    assert num(_s("-2.5", "-2.5")) == 1.0


def test_format_reward_is_a_regex_not_code():
    fmt = build_reward(RewardConfig(name="format", kwargs={"pattern": r"<answer>\d+</answer>"}))
    assert fmt(_s("<answer>42</answer>", "")) == 1.0
    assert fmt(_s("x <answer>42</answer>", "")) == 0.0
    search = build_reward(
        RewardConfig(name="format", kwargs={"pattern": r"\d+", "full": False, "reward": 0.2})
    )
    assert search(_s("x 42", "")) == 0.2
    assert build_reward(RewardConfig(name="contains"))(_s("the answer is 7.", "7")) == 1.0


def test_registry_errors_name_the_choices():
    assert {"exact_match", "numeric_answer", "format"} <= set(reward_names())
    with pytest.raises(ValueError, match="unknown reward 'python'; choose one of"):
        build_reward(RewardConfig.model_construct(name="python", kwargs={"code": "import os"}))
    with pytest.raises(ValueError, match="it takes: strip, case_sensitive, prefix_credit"):
        build_reward(RewardConfig(name="exact_match", kwargs={"bogus": 1}))
    with pytest.raises(ValueError, match="not a regular expression RE2 accepts"):
        build_reward(RewardConfig.model_construct(name="format", kwargs={"pattern": "("}))


@pytest.mark.parametrize(
    ("name", "kwargs", "says"),
    [
        ("exact_match", {"strp": True}, "it takes: strip, case_sensitive, prefix_credit"),  # misspelt
        ("format", {}, "missing a required argument: 'pattern'"),
        ("format", {"pattern": "(unclosed"}, "missing )"),
        ("format", {"pattern": r"(a)\1"}, "no backreferences or lookarounds"),
        ("format", {"pattern": r"(?=x)x"}, "no backreferences or lookarounds"),
        ("numeric_answer", {"tolerance": "abc"}, "wrong type"),
        ("numeric_answer", {"tolerance": -1}, "tolerance must be >= 0"),
        ("exact_match", {"prefix_credit": 2}, "prefix_credit must be between 0 and 1"),
        ("math_verify", {"answer_format": "latex"}, "answer_format must be auto, gsm8k or boxed"),
    ],
)
def test_reward_arguments_are_checked_with_the_config_naming_the_field(name, kwargs, says):
    """The platform parses the config when an experiment is created: a wrong argument is a 400 there, not
    a job that fails (or backtracks) later."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        RewardConfig(name=name, kwargs=kwargs)
    (error,) = info.value.errors()
    assert error["loc"] == ("kwargs",) and says in error["msg"], error


@pytest.mark.timeout(30)
def test_a_catastrophic_pattern_matches_in_linear_time_with_the_same_answers_as_python():
    """``(a+)+$`` backtracks exponentially in Python's re on "aaa...ab" (30 a's: minutes); on RE2 the
    match is linear. On ordinary patterns the answers equal Python's (the reference)."""
    import re

    evil = build_reward(RewardConfig(name="format", kwargs={"pattern": "(a+)+$", "full": False}))
    assert evil(_s("a" * 100_000 + "b", "")) == 0.0
    assert evil(_s("b" + "a" * 100_000, "")) == 1.0
    texts = ["<answer>42</answer>", "x <answer>4</answer> y", "Answer: 12.5", "no", "", "#### 7\n"]
    for pattern in [r"<answer>\d+</answer>", r"Answer: [0-9.]+", r"#### \d+", r"\w+", r"(yes|no)"]:
        for full in (True, False):
            ours = build_reward(RewardConfig(name="format", kwargs={"pattern": pattern, "full": full}))
            match = re.compile(pattern).fullmatch if full else re.compile(pattern).search
            for text in texts:
                assert ours(_s(text, "")) == float(bool(match(text.strip()))), (pattern, full, text)


def test_an_unknown_reward_name_is_not_echoed_whole():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        RewardConfig(name="x" * 1_000_000)
    assert len(str(info.value)) < 1000


# --- math-verify --------------------------------------------------------------------------------------

GSM8K_GOLD = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("She sold 48 + 24 = 72 clips in total.\n#### 72", GSM8K_GOLD, 1.0),  # GSM8K marker
        ("48 + 24 = 72, so the answer is 72.", GSM8K_GOLD, 1.0),  # plain last number
        ("The total is $72.00", GSM8K_GOLD, 1.0),  # units and decimals
        (r"The answer is \boxed{72 \text{ clips}}", GSM8K_GOLD, 1.0),  # boxed with a unit
        ("#### 71", GSM8K_GOLD, 0.0),  # wrong
        ("48 + 24 = 72\n#### 70", GSM8K_GOLD, 0.0),  # right work, wrong final answer
        ("#### 1,000", "1000", 1.0),  # thousands separator
        (r"So the probability is $\boxed{\frac{2}{4}}$.", r"\frac{1}{2}", 1.0),  # equivalent fractions
        (r"\boxed{0.5}", r"$\frac{1}{2}$", 1.0),
        (r"x = \boxed{\sqrt{2}/2}", r"\frac{\sqrt{2}}{2}", 1.0),  # LaTeX expressions
        (r"\boxed{x^2+2x}", "x(x+2)", 1.0),  # symbolic equivalence
        (r"\boxed{\frac{1}{3}}", "0.25", 0.0),
        ("I am not sure.", GSM8K_GOLD, 0.0),
        ("", GSM8K_GOLD, 0.0),
    ],
)
def test_math_verify_reward_on_real_looking_answers(response: str, answer: str, expected: float):
    fn = build_reward(RewardConfig(name="math_verify"))
    assert fn(_s(response, answer)) == expected
    assert fn.errors == 0


def test_math_verify_answer_formats_and_format_reward():
    gsm = build_reward(
        RewardConfig(name="math_verify", kwargs={"answer_format": "gsm8k", "format_reward": 0.1})
    )
    assert gsm(_s("#### 72", GSM8K_GOLD)) == 1.0
    assert gsm(_s("#### 70", GSM8K_GOLD)) == 0.1  # the expected format, a wrong answer
    assert gsm(_s("the answer is 72", GSM8K_GOLD)) == 0.0  # right number, but not where it must be
    boxed = build_reward(RewardConfig(name="math_verify", kwargs={"answer_format": "boxed"}))
    assert boxed(_s(r"so \boxed{72}", GSM8K_GOLD)) == 1.0
    assert boxed(_s("72", GSM8K_GOLD)) == 0.0
    with pytest.raises(ValueError, match="format_reward must be between 0 and correct_reward"):
        build_reward(RewardConfig(name="math_verify", kwargs={"format_reward": 2.0}))
    with pytest.raises(ValueError, match="it takes: answer_format"):
        build_reward(RewardConfig(name="math_verify", kwargs={"format": "boxed"}))


def test_math_verify_works_off_the_main_thread(monkeypatch, caplog):
    # The rollouter scores in a worker thread, where math-verify's signal-based timeout cannot run; its
    # once-per-process notice that the timeout is off is by design there, and not logged.
    import math_verify.grader
    import math_verify.parser

    monkeypatch.setattr(math_verify.parser, "TIMEOUT_WARNING_SHOWN", False)  # as in a fresh process
    monkeypatch.setattr(math_verify.grader, "TIMEOUT_WARNING_SHOWN", False)
    fn = build_reward(RewardConfig(name="math_verify"))
    out: list[float] = []
    t = threading.Thread(target=lambda: out.extend(fn(_s(r, GSM8K_GOLD)) for r in ["#### 72", "#### 7"]))
    with caplog.at_level(logging.WARNING):
        t.start()
        t.join()
    assert out == [1.0, 0.0]
    assert fn.errors == 0
    assert math_verify.parser.TIMEOUT_WARNING_SHOWN  # the notice was issued, and filtered
    assert "Timeout is disabled" not in caplog.text


# --- rewards that fail ----------------------------------------------------------------------------------


def test_a_reward_that_raises_scores_zero_is_counted_and_logged(monkeypatch, caplog):
    calls = {"n": 0}

    def flaky() -> Callable[[Sample], float]:
        def fn(sample: Sample) -> float:
            calls["n"] += 1
            if sample.response_text == "boom":
                raise RuntimeError("verifier crashed")
            if sample.response_text == "nan":
                return float("nan")
            return 1.0

        return fn

    monkeypatch.setitem(REWARDS, "flaky", flaky)
    fn = build_reward(RewardConfig.model_construct(name="flaky", kwargs={}))  # not a name the config knows
    fn.log_first, fn.log_every = 2, 3
    samples = [_s(r, "1") for r in ["ok", "boom", "nan", "boom", "boom", "ok", "boom", "boom", "boom"]]
    with caplog.at_level(logging.WARNING, logger="rl_engine.rewards"):
        rewards = [fn(s) for s in samples]
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert fn.errors == 7 and fn.stats() == {
        "reward/errors": 7.0,
        "reward/calls": 9.0,
        "reward/unscored": 0.0,
    }
    assert [s.extra.get("reward_error") for s in samples[:3]] == [None, 1.0, 1.0]
    logged = [r.getMessage() for r in caplog.records]
    # the first two failures in full, then every third: failures 3 and 6
    assert len(logged) == 4, logged
    assert (
        "reward 'flaky' failed on prompt p (1 failures so far, scored 0.0): RuntimeError: verifier crashed"
        in logged[0]
    )
    assert "ValueError: returned nan" in logged[1]
    assert calls["n"] == 9

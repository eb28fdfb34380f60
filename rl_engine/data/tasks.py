"""Built-in verifiable tasks: each makes one (prompt text, answer) pair from a seeded ``random.Random``.

Prompts stay short (roughly 8-16 characters) so that a tiny model on a CPU spends its time on the
answer. Difficulty, easiest first: ``next_digit`` and ``copy`` (learned from scratch in well under a
minute), ``add_mod10``, ``reverse``, ``add`` (multi-digit addition; slow to learn on a CPU).
"""

from __future__ import annotations

import inspect
import random
import string
from collections.abc import Callable
from typing import Any

TaskFn = Callable[..., tuple[str, str]]


def copy_char(rng: random.Random, alphabet: str = string.ascii_lowercase) -> tuple[str, str]:
    """``copy q:`` -> ``q``: repeat the prompt's character."""
    c = rng.choice(alphabet)
    return f"copy {c}:", c


def next_digit(rng: random.Random) -> tuple[str, str]:
    """``after 3:`` -> ``4``: the next digit, wrapping 9 -> 0."""
    d = rng.randrange(10)
    return f"after {d}:", str((d + 1) % 10)


def add_mod10(rng: random.Random) -> tuple[str, str]:
    """``3+8 mod 10=`` -> ``1``: add two digits, keep the last digit."""
    a, b = rng.randrange(10), rng.randrange(10)
    return f"{a}+{b} mod 10=", str((a + b) % 10)


def reverse(rng: random.Random, length: int = 3, alphabet: str = "abcdef") -> tuple[str, str]:
    """``rev abc:`` -> ``cba``."""
    if length < 1:
        raise ValueError("length must be >= 1")
    s = "".join(rng.choice(alphabet) for _ in range(length))
    return f"rev {s}:", s[::-1]


def add(rng: random.Random, digits: int = 2) -> tuple[str, str]:
    """``23+45=`` -> ``68``: add two numbers of up to ``digits`` digits."""
    if not 1 <= digits <= 6:
        raise ValueError("digits must be between 1 and 6")
    hi = 10**digits
    a, b = rng.randrange(hi), rng.randrange(hi)
    return f"{a}+{b}=", str(a + b)


TASKS: dict[str, TaskFn] = {
    "copy": copy_char,
    "next_digit": next_digit,
    "add_mod10": add_mod10,
    "reverse": reverse,
    "add": add,
}


def task_names() -> list[str]:
    return sorted(TASKS)


def task_catalogue() -> dict[str, Any]:
    """The built-in tasks, JSON-ready (``python -m rl_engine tasks --json``): name, description (the
    docstring's first line), parameters (the signature's, less ``rng``), origin ``builtin``."""
    from rl_engine.reward_plugins import describe_factory

    tasks = []
    for name, fn in TASKS.items():
        described = describe_factory(fn)
        params = [p for p in described["parameters"] if p["name"] != "rng"]
        tasks.append({"name": name, **described, "parameters": params, "origin": "builtin"})
    return {"tasks": tasks}


def make_task(name: str, kwargs: dict) -> Callable[[random.Random], tuple[str, str]]:
    """Bind a task's kwargs, rejecting unknown names and arguments with a message that lists the valid ones."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(task_names())}")
    fn = TASKS[name]
    params = [p for p in inspect.signature(fn).parameters if p != "rng"]
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ValueError(
            f"task {name!r} takes no argument {', '.join(unknown)}; its arguments: {', '.join(params) or 'none'}"
        )
    fn(random.Random(0), **kwargs)  # fail now on a bad value, not in the middle of a run
    return lambda rng: fn(rng, **kwargs)

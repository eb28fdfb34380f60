"""The ``reasoning_gym`` reward: a response scored by the ``score_answer`` of the reasoning-gym dataset its
prompt came from (``data.source: reasoning_gym``), in [0, 1].

Each such prompt carries, in ``Prompt.metadata["reasoning_gym"]`` (JSON-safe, see ``entry_metadata``),
the dataset's name, the exact options it was generated with (seed and size included), the entry's index
and a JSON copy of the entry. The reward re-creates the dataset from name and options (once per process:
``procedural_dataset`` caches it) and scores against the entry the generator makes at that index again,
so ``score_answer`` sees the very Python values it expects (a JSON copy turns ARC's tuple grids into
lists, which compare unequal); the copy's question is checked against it.

What of the response is the answer (``extract``):

* ``auto`` (the default): the text inside the last ``<answer>...</answer>`` when there is one, else the
  response's last non-empty line;
* ``answer_tags``: the last ``<answer>...</answer>`` only (no tags: no answer, score 0), the format of
  reasoning-gym's own system prompts;
* ``last_line``: the last non-empty line;
* ``boxed``: the content of the last ``\\boxed{...}`` (no box: no answer);
* ``last_number``: the last ``<answer>...</answer>`` when there is one, else the last number of the
  response (``-12``, ``3.5``, ``1,000`` as ``1000``): for tasks whose answer is a number, asked of a
  small model that answers in a sentence ("So, 45 + 46 equals 91.");
* ``none``: the whole response, stripped.

reasoning-gym is imported when the first sample is scored (seconds, with matplotlib and sympy), never
when a config is checked: building the reward only looks for the package.
"""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from rl_engine.types import Sample

METADATA_KEY = "reasoning_gym"
EXTRACTIONS = ("auto", "answer_tags", "last_line", "boxed", "last_number", "none")
# a number as written in prose: optional sign, digits with optional thousands commas, optional decimals
_NUMBER = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,]*\d)|(?<![\w.])-?\d+(?:\.\d+)?")
_ANSWER_TAGS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\s*\{")
_lock = threading.Lock()


def options_key(options: dict[str, Any]) -> str:
    """A dataset's options as one canonical string (the cache key)."""
    return json.dumps(options, sort_keys=True, separators=(",", ":"))


@lru_cache(maxsize=64)
def _dataset(name: str, key: str) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, **json.loads(key))


def procedural_dataset(name: str, options: dict[str, Any]) -> Any:
    """The reasoning-gym dataset ``name`` built with ``options`` (seed and size included): one object per
    (name, options) in a process, shared by the data stream and the reward."""
    with _lock:  # two threads must not build the same (possibly large) dataset twice
        return _dataset(name, options_key(options))


@lru_cache(maxsize=8192)
def _entry(name: str, key: str, index: int) -> dict[str, Any]:
    return procedural_dataset(name, json.loads(key))[index]


def dataset_entry(name: str, options: dict[str, Any], index: int) -> dict[str, Any]:
    """Entry ``index`` of the dataset (cached: every response to a prompt scores against the same one).
    Treat it as read-only."""
    return _entry(name, options_key(options), index)


def plain(value: Any) -> Any:
    """A JSON-safe copy (tuples become lists, other objects their ``str``)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    if hasattr(value, "item"):  # a numpy scalar
        return plain(value.item())
    return str(value)


def entry_metadata(name: str, options: dict[str, Any], index: int, entry: dict[str, Any]) -> dict[str, Any]:
    """What a prompt carries for this reward: ``{"reasoning_gym": {dataset, options, index, entry}}``."""
    return {
        METADATA_KEY: {
            "dataset": name,
            "options": dict(options),
            "index": index,
            "entry": plain(entry),
        }
    }


def _last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces balanced), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
    return None


def extract_answer(text: str, extract: str) -> str | None:
    """The answer part of a response under an ``extract`` mode (see the module docstring); None: none."""
    if extract == "none":
        return text.strip()
    if extract == "last_line":
        return _last_line(text)
    if extract == "boxed":
        return _boxed(text)
    tagged = _ANSWER_TAGS.findall(text)
    if tagged:
        return tagged[-1].strip()
    if extract == "last_number":
        numbers = _NUMBER.findall(text)
        return numbers[-1].replace(",", "") if numbers else None
    return _last_line(text) if extract == "auto" else None


def reasoning_gym_reward(extract: str = "auto") -> Callable[[Sample], float]:
    """The dataset's own ``score_answer(answer, entry)`` of the answer ``extract`` takes from the response."""
    if extract not in EXTRACTIONS:
        raise ValueError(f"extract must be one of {', '.join(EXTRACTIONS)}")
    if importlib.util.find_spec("reasoning_gym") is None:
        raise ValueError("reward 'reasoning_gym' needs the reasoning-gym package (pip install reasoning-gym)")

    def fn(sample: Sample) -> float:
        info = sample.metadata.get(METADATA_KEY)
        if not isinstance(info, dict):
            raise ValueError(
                "the prompt carries no reasoning-gym entry: reward 'reasoning_gym' scores prompts of "
                "data.source 'reasoning_gym'"
            )
        name, options, index = info["dataset"], info["options"], int(info["index"])
        entry = dataset_entry(name, options, index)
        carried = info.get("entry") or {}
        if carried.get("question") not in (None, entry["question"]):
            raise ValueError(
                f"{name} entry {index} is not the prompt's question (another reasoning-gym version?)"
            )
        dataset = procedural_dataset(name, options)
        return float(dataset.score_answer(extract_answer(sample.response_text, extract), entry))

    return fn

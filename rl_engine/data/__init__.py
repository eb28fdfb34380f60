"""Prompt streams: built-in seeded tasks or a JSONL file, deterministic from ``cfg.seed`` and resumable."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from rl_engine.config import ExperimentConfig, JsonlDataConfig, TaskDataConfig
from rl_engine.data.tasks import TASKS, make_task, task_names
from rl_engine.types import Prompt


class DataError(ValueError):
    """A dataset problem, phrased for one line (names the file and line)."""


def load_jsonl(
    path: str | Path, prompt_field: str = "prompt", answer_field: str = "answer"
) -> list[tuple[str, str]]:
    """Read (prompt, answer) pairs; blank lines are skipped; any bad line raises DataError naming it."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DataError(f"cannot read {p}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DataError(f"{p} is not UTF-8 text") from None
    records: list[tuple[str, str]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{p}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        for field in (prompt_field, answer_field):
            if field not in obj:
                raise DataError(f"{p}:{lineno}: missing field {field!r}")
        prompt, answer = obj[prompt_field], obj[answer_field]
        if not isinstance(prompt, str) or not prompt:
            raise DataError(f"{p}:{lineno}: field {prompt_field!r} must be a non-empty string")
        if not isinstance(answer, str | int | float) or isinstance(answer, bool):
            raise DataError(f"{p}:{lineno}: field {answer_field!r} must be a string or a number")
        records.append((prompt, str(answer)))
    if not records:
        raise DataError(f"{p}: no records")
    return records


class PromptStream:
    """An endless, deterministic stream of prompts.

    Tasks: prompt ``i`` is example ``i % num_prompts``, generated from a RNG seeded by (seed, task,
    example index), so the stream cycles over ``num_prompts`` distinct examples. JSONL: epochs over the
    file, each in an order shuffled from (seed, epoch). The only state is the position, which
    ``state_dict``/``load_state_dict`` carry across a checkpoint.
    """

    def __init__(self, cfg: ExperimentConfig, tokenizer: Any):
        self._tokenizer = tokenizer
        self._max_prompt_tokens = cfg.rollout.max_prompt_tokens
        self._seed = cfg.seed
        self._position = 0
        data = cfg.data
        self._task = None
        self._records: list[tuple[str, str]] = []
        if isinstance(data, TaskDataConfig):
            self._task = make_task(data.task, data.task_kwargs)
            self._task_name = data.task
            self._size = data.num_prompts
        else:
            assert isinstance(data, JsonlDataConfig)
            self._records = load_jsonl(data.path, data.prompt_field, data.answer_field)
            self._size = len(self._records)
        self._epoch_order: tuple[int, list[int]] | None = None

    def __len__(self) -> int:
        """Distinct examples per epoch."""
        return self._size

    @property
    def position(self) -> int:
        return self._position

    def _example(self, i: int) -> tuple[str, str]:
        epoch, j = divmod(i, self._size)
        if self._task is not None:
            return self._task(random.Random(f"{self._seed}:{self._task_name}:{j}"))
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            order = list(range(self._size))
            random.Random(f"{self._seed}:epoch:{epoch}").shuffle(order)
            self._epoch_order = (epoch, order)
        return self._records[self._epoch_order[1][j]]

    def _tokenize(self, text: str) -> list[int]:
        ids = list(self._tokenizer(text)["input_ids"])
        # Keep the end of an over-long prompt: the question usually sits there.
        return ids[-self._max_prompt_tokens :]

    def next_batch(self, k: int) -> list[Prompt]:
        """The next ``k`` prompts; advances the position by ``k``."""
        out = []
        for _ in range(k):
            i = self._position
            text, answer = self._example(i)
            out.append(Prompt(uid=f"p{i}", token_ids=self._tokenize(text), text=text, answer=answer, index=i))
            self._position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"position": self._position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._position = int(state["position"])


__all__ = ["TASKS", "DataError", "PromptStream", "load_jsonl", "make_task", "task_names"]

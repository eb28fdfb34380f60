"""Row sources: where prompts come from, before any tokenizer sees them.

A source is a finite, indexable sequence of ``Row``s: a built-in task's ``num_prompts`` seeded
examples, the records of a JSONL file, or a Hugging Face ``datasets.Dataset`` split (read row by row
from its memory-mapped arrow table, never materialised as Python objects).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rl_engine import paths
from rl_engine.config import DatasetColumns


class DataError(ValueError):
    """A dataset problem, phrased for one line (names the file, line, column or split)."""


@dataclass(frozen=True)
class Row:
    """One dataset example: a text prompt or chat messages, the reference answer, optional extras."""

    answer: str
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    system: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class RowSource(Protocol):
    def __len__(self) -> int: ...

    def row(self, j: int) -> Row: ...


class TaskRows:
    """``size`` examples of a built-in task; example ``j`` comes from a RNG seeded by (seed, stream, j)."""

    def __init__(
        self,
        fn: Callable[[random.Random], tuple[str, str]],
        name: str,
        seed: int,
        size: int,
        stream: str = "",
    ):
        self._fn, self._key, self._size = fn, f"{seed}:{name}:{stream}" if stream else f"{seed}:{name}", size

    def __len__(self) -> int:
        return self._size

    def row(self, j: int) -> Row:
        prompt, answer = self._fn(random.Random(f"{self._key}:{j}"))
        return Row(answer=answer, prompt=prompt)


class ListRows:
    def __init__(self, rows: Sequence[Row]):
        self._rows = list(rows)

    def __len__(self) -> int:
        return len(self._rows)

    def row(self, j: int) -> Row:
        return self._rows[j]


def check_local_data(path: str | Path) -> None:
    """Refuse a local data path that reads outside the data roots a platform job was given
    (``RL_ENGINE_DATA_ROOTS``): the file, a glob's matches or a folder's entries, by real path, checked
    right before reading. Without roots (the CLI) nothing is checked."""
    roots = paths.roots_from_env()
    if not roots:
        return
    try:
        escapes = paths.escaping(path, roots)
    except paths.TooManyEntries as exc:
        raise DataError(str(exc)) from None
    if escapes:
        raise DataError(
            f"{path}: reads {escapes[0]}, whose real path (symlinks followed) leaves the data roots "
            f"{', '.join(roots)}"
        )


def load_jsonl(
    path: str | Path, prompt_field: str = "prompt", answer_field: str = "answer"
) -> list[tuple[str, str]]:
    """Read (prompt, answer) pairs; blank lines are skipped; any bad line raises DataError naming it."""
    p = Path(path)
    check_local_data(p)
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
        for name in (prompt_field, answer_field):
            if name not in obj:
                raise DataError(f"{p}:{lineno}: missing field {name!r}")
        prompt, answer = obj[prompt_field], obj[answer_field]
        if not isinstance(prompt, str) or not prompt:
            raise DataError(f"{p}:{lineno}: field {prompt_field!r} must be a non-empty string")
        if not isinstance(answer, str | int | float) or isinstance(answer, bool):
            raise DataError(f"{p}:{lineno}: field {answer_field!r} must be a string or a number")
        records.append((prompt, str(answer)))
    if not records:
        raise DataError(f"{p}: no records")
    return records


def jsonl_rows(path: str | Path, prompt_field: str, answer_field: str) -> ListRows:
    return ListRows([Row(answer=a, prompt=p) for p, a in load_jsonl(path, prompt_field, answer_field)])


def _plain(value: Any) -> Any:
    """A JSON-friendly copy of a cell (arrow gives dates, decimals, numpy scalars in some schemas)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):  # numpy scalar
        return value.item()
    return str(value)


def _messages(value: Any, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: expected a non-empty list of {{role, content}} messages")
    out = []
    for m in value:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise DataError(f"{where}: every message needs a string role and content, got {m!r:.80}")
        out.append({"role": m["role"], "content": m["content"]})
    return tuple(out)


class DatasetRows:
    """Rows of a ``datasets.Dataset`` through a column mapping (checked once, up front)."""

    def __init__(self, dataset: Any, columns: DatasetColumns, where: str):
        self._ds, self._cols, self._where = dataset, columns, where
        wanted = [c for c in (columns.prompt, columns.messages, columns.answer, columns.system) if c]
        wanted += columns.metadata
        missing = [c for c in wanted if c not in dataset.column_names]
        if missing:
            raise DataError(
                f"{where}: no column {', '.join(map(repr, missing))}; its columns: {', '.join(dataset.column_names)}"
                " (map them with data.columns)"
            )
        if len(dataset) == 0:
            raise DataError(f"{where}: no rows")

    def __len__(self) -> int:
        return len(self._ds)

    def row(self, j: int) -> Row:
        rec = self._ds[j]
        cols, where = self._cols, f"{self._where} row {j}"
        answer = rec[cols.answer]
        if answer is None or isinstance(answer, bool) or not isinstance(answer, str | int | float):
            raise DataError(
                f"{where}: column {cols.answer!r} must be a string or a number, got {answer!r:.60}"
            )
        system = rec[cols.system] if cols.system else None
        if cols.messages:
            return Row(
                answer=str(answer),
                messages=_messages(rec[cols.messages], f"{where}, column {cols.messages!r}"),
                system=system or None,
                metadata={c: _plain(rec[c]) for c in cols.metadata},
            )
        prompt = rec[cols.prompt]
        if not isinstance(prompt, str) or not prompt:
            raise DataError(f"{where}: column {cols.prompt!r} must be a non-empty string")
        return Row(
            answer=str(answer),
            prompt=prompt,
            system=system or None,
            metadata={c: _plain(rec[c]) for c in cols.metadata},
        )

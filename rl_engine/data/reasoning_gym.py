"""Rows of ``data.source: reasoning_gym``: a weighted mix of reasoning-gym's procedural datasets.

A split of ``size`` rows: row ``j`` comes from dataset ``k`` (drawn by weight from a RNG seeded by
(``data.seed``, split); the choices are made once for the split) and is that dataset's entry ``j``. Each
dataset of each split is generated from its own seed, derived from (``data.seed``, split, its place in
``data.datasets``, its name) by SHA-256: the held-out split (``test``) never uses a seed of the train
split. reasoning-gym seeds entry ``j`` of a dataset with ``seed + j``, so two seeds a few apart would
share most entries; hashed seeds lie anywhere in [0, 2**32) (two within a split's size of each other are
unlikely, not impossible), and on top of that the held-out split is guaranteed disjoint: every held-out candidate whose question is a question of the train split (or an
earlier held-out one) is dropped, and candidates are drawn until ``test_size`` remain (or a bound of
draws is spent: a dataset whose options allow few distinct questions then gives fewer, and none at all
is an error).

Each row's metadata carries what the ``reasoning_gym`` reward needs to score it
(``rl_engine.rewards.reasoning_gym.entry_metadata``).
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache
from typing import Any

from rl_engine.config import ReasoningGymDataConfig
from rl_engine.data.rows import DataError, Row
from rl_engine.rewards.reasoning_gym import dataset_entry, entry_metadata, plain, procedural_dataset

TRAIN, TEST = "train", "test"
# Entries tried in turn where the generator fails on one (``generate``).
MAX_TRIES = 16


def dataset_seed(seed: int, split: str, position: int, name: str) -> int:
    """The seed of dataset ``position`` (named ``name``) of ``split``: a hash, in [0, 2**32)."""
    digest = hashlib.sha256(f"{seed}:reasoning_gym:{split}:{position}:{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def dataset_options(data: ReasoningGymDataConfig, split: str, size: int) -> list[dict[str, Any]]:
    """The options each dataset of ``split`` is created with: its config, its seed, the split's size."""
    return [
        {**spec.config, "seed": dataset_seed(data.seed, split, i, spec.name), "size": size}
        for i, spec in enumerate(data.datasets)
    ]


def _build(data: ReasoningGymDataConfig, options: list[dict[str, Any]]) -> list[Any]:
    """The datasets (one line of error naming the one whose options reasoning-gym refuses)."""
    try:
        import reasoning_gym  # noqa: F401
    except ImportError:
        raise DataError(
            "data.source reasoning_gym needs the reasoning-gym package (pip install reasoning-gym)"
        ) from None
    out = []
    for i, (spec, opts) in enumerate(zip(data.datasets, options, strict=True)):
        try:
            out.append(procedural_dataset(spec.name, opts))
        except Exception as exc:  # AssertionError of a config's validate(), TypeError, ValueError
            detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise DataError(f"data.datasets[{i}].config ({spec.name}): {detail}") from None
    return out


def generate(name: str, options: dict[str, Any], index: int) -> tuple[int, dict[str, Any]]:
    """(index, entry): entry ``index`` of the dataset, or, where the generator fails on it (some do, rarely:
    basic_arithmetic divides by a zero it drew), the first of the next indices (wrapping at the size)
    that it generates: the same one in every process, and the index the reward regenerates."""
    size = int(options["size"])
    problem: Exception | None = None
    for attempt in range(MAX_TRIES):
        at = (index + attempt) % size
        try:
            return at, dataset_entry(name, options, at)
        except Exception as exc:
            problem = exc
    raise DataError(
        f"{name}: generating entries {index}.. failed {MAX_TRIES} times in a row: "
        f"{type(problem).__name__}: {str(problem).splitlines()[0][:200] if str(problem) else ''}"
    )


def _picks(data: ReasoningGymDataConfig, split: str, count: int) -> list[int]:
    weights = [spec.weight for spec in data.datasets]
    if len(weights) == 1:
        return [0] * count
    rng = random.Random(f"{data.seed}:reasoning_gym:{split}:picks")
    return rng.choices(range(len(weights)), weights=weights, k=count)


class ReasoningGymRows:
    """The rows of one split: ``slots[j]`` = (dataset position, entry index); entries are generated when
    a row is read (``dataset_entry`` caches the recent ones, which the reward then finds)."""

    def __init__(
        self,
        data: ReasoningGymDataConfig,
        options: list[dict[str, Any]],
        slots: list[tuple[int, int]],
    ):
        self._names = [spec.name for spec in data.datasets]
        self._options = options
        self._slots = slots

    def __len__(self) -> int:
        return len(self._slots)

    def entry(self, j: int) -> tuple[str, dict[str, Any], int, dict[str, Any]]:
        """(dataset name, its options, entry index, entry) of row ``j``."""
        k, index = self._slots[j]
        name, options = self._names[k], self._options[k]
        index, entry = generate(name, options, index)
        return name, options, index, entry

    def row(self, j: int) -> Row:
        name, options, index, entry = self.entry(j)
        answer = entry.get("answer")
        return Row(
            answer="" if answer is None else str(answer),
            prompt=str(entry["question"]),
            metadata=entry_metadata(name, options, index, entry),
        )


def train_split(data: ReasoningGymDataConfig) -> ReasoningGymRows:
    options = dataset_options(data, TRAIN, data.train_size)
    _build(data, options)
    picks = _picks(data, TRAIN, data.train_size)
    return ReasoningGymRows(data, options, [(k, j) for j, k in enumerate(picks)])


def _train_questions(data: ReasoningGymDataConfig) -> set[str]:
    """Every question of the train split."""
    rows = train_split(data)
    return {str(rows.entry(j)[3]["question"]) for j in range(len(rows))}


@lru_cache(maxsize=4)
def _test_slots(data_json: str) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
    data = ReasoningGymDataConfig.model_validate_json(data_json)
    limit = data.held_out_draws
    options = dataset_options(data, TEST, limit)
    _build(data, options)
    taken = _train_questions(data)
    slots: list[tuple[int, int]] = []
    for j, k in enumerate(_picks(data, TEST, limit)):
        if len(slots) == data.test_size:
            break
        name = data.datasets[k].name
        try:
            entry = dataset_entry(name, options[k], j)
        except Exception:  # a candidate the generator fails on is not drawn (see ``generate``)
            continue
        question = str(entry["question"])
        if question in taken:
            continue
        taken.add(question)
        slots.append((k, j))
    if not slots:
        raise DataError(
            f"data.test_size: every held-out question of {limit} drawn is also a training question (or "
            "drawn twice): the datasets' options allow too few distinct questions for "
            f"train_size={data.train_size}; lower it or widen the options"
        )
    return options, slots


def held_out_split(data: ReasoningGymDataConfig) -> ReasoningGymRows | None:
    """The held-out rows (None when ``test_size`` is 0): no question of them is a training question."""
    if not data.test_size:
        return None
    options, slots = _test_slots(data.model_dump_json())
    return ReasoningGymRows(data, options, slots)


# Options of a dataset's config that the engine sets itself (a config may not name them).
ENGINE_SET = ("seed", "size")


def _type_text(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def dataset_catalogue() -> dict[str, Any]:
    """The reasoning-gym datasets a config may name (``data.source: reasoning_gym``: the installed ones
    not refused, ``names.REASONING_GYM_REFUSED``), JSON-ready, for ``python -m rl_engine tasks --json``:
    ``{"reasoning_gym": [...], "reasoning_gym_error": None}``, each entry its name, ``source``
    (``reasoning-gym <version>``), description (its class docstring's first line) and parameters (the
    fields of its config dataclass but ``seed`` and ``size``: name, type, required, default). Without the
    package the list is empty and ``reasoning_gym_error`` says why."""
    import dataclasses

    from rl_engine.config import names

    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError as exc:
        return {"reasoning_gym": [], "reasoning_gym_error": f"reasoning-gym is not installed ({exc})"}
    source = f"reasoning-gym {getattr(reasoning_gym, '__version__', '?')}"
    offered = set(names.REASONING_GYM_DATASETS.names)
    out = []
    for name in sorted(DATASETS):
        if name not in offered or name in names.REASONING_GYM_REFUSED:
            continue
        dataset_cls, config_cls = DATASETS[name]
        params = []
        for f in dataclasses.fields(config_cls):
            if f.name in ENGINE_SET or not f.init:
                continue
            entry: dict[str, Any] = {"name": f.name, "type": _type_text(f.type)}
            if f.default is not dataclasses.MISSING:
                entry |= {"required": False, "default": plain(f.default)}
            elif f.default_factory is not dataclasses.MISSING:
                entry |= {"required": False, "default": plain(f.default_factory())}
            else:
                entry["required"] = True
            params.append(entry)
        doc = (dataset_cls.__doc__ or "").strip().splitlines()
        out.append(
            {
                "name": name,
                "data_source": "reasoning_gym",
                "source": source,
                "description": doc[0].strip() if doc else "",
                "parameters": params,
            }
        )
    return {"reasoning_gym": out, "reasoning_gym_error": None}

"""A small GSM8K-format dataset generated locally: word problems whose solutions end in ``#### N``.

Same columns as ``openai/gsm8k`` (``question``, ``answer``), same answer convention, written as a data
directory laid out like the hub repository (``train.parquet``, ``test.parquet``), so the CPU preset
runs the exact path the GPU preset takes with the real dataset. Lower case only and short numbers: the
tiny model's character vocabulary has no upper case, and a CPU run should see rewards within minutes.

With ``transfer_size`` the folder also holds a ``transfer`` split (``transfer.parquet``, named with the
others in a dataset card, ``README.md``, the hub's way to declare a split of any name): problems the train
split never shows, half one operation in wordings no train problem uses, half two operations in a row.
A run evaluates it beside the test split (``data.extra_validation_splits``) to tell whether what the
policy learned is arithmetic or the train split's phrasing. Its rows come from their own random stream:
the train and test splits are the same with or without it.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

from rl_engine.config import SyntheticDataSpec

_NAMES = ["tom", "ana", "li", "sam", "mia", "omar", "zoe", "raj"]
_ITEMS = ["apple", "book", "coin", "shell", "card", "pen", "egg", "cup"]


def make_problem(rng: random.Random, max_value: int) -> tuple[str, str]:
    """One (question, answer) pair; the answer is a short solution ending in ``#### <number>``."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(1, max_value), rng.randint(1, max_value)
    kind = rng.choice(["add", "sub", "mul"])
    if kind == "add":
        q = f"{name} has {a} {item}s and gets {b} more. how many {item}s does {name} have now?"
        work, n = f"{a} + {b} = {a + b}", a + b
    elif kind == "sub":
        a, b = max(a, b), min(a, b)
        q = f"{name} has {a} {item}s and gives away {b}. how many {item}s are left?"
        work, n = f"{a} - {b} = {a - b}", a - b
    else:
        q = f"{name} buys {a} boxes with {b} {item}s in each. how many {item}s is that?"
        work, n = f"{a} * {b} = {a * b}", a * b
    return q, f"{name} ends up with {work} {item}s.\n#### {n}"


TRANSFER_KINDS = ("add_reworded", "sub_reworded", "mul_reworded", "add_then_sub", "mul_then_sub")


def make_transfer_problem(rng: random.Random, max_value: int, kind: str) -> tuple[str, str]:
    """One (question, answer) pair of ``kind`` (``TRANSFER_KINDS``): a wording no ``make_problem`` question
    uses (the first three: one operation) or two operations in a row (the last two)."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(1, max_value), rng.randint(1, max_value)
    if kind == "add_reworded":
        q = f"there are {a} {item}s on a table and {name} puts {b} more there. what is the total number of {item}s?"
        work, n = f"{a} + {b} = {a + b}", a + b
    elif kind == "sub_reworded":
        a, b = max(a, b), min(a, b)
        q = f"a jar holds {a} {item}s. {name} takes out {b}. how many {item}s stay in the jar?"
        work, n = f"{a} - {b} = {a - b}", a - b
    elif kind == "mul_reworded":
        q = f"{name} makes {a} piles of {item}s with {b} in every pile. what is the total number of {item}s?"
        work, n = f"{a} * {b} = {a * b}", a * b
    elif kind == "add_then_sub":
        c = rng.randint(1, a + b)
        q = f"{name} has {a} {item}s, gets {b} more, then gives away {c}. how many {item}s does {name} have now?"
        work, n = f"{a} + {b} = {a + b}, {a + b} - {c} = {a + b - c}", a + b - c
    elif kind == "mul_then_sub":
        c = rng.randint(1, a * b)
        q = f"{name} buys {a} boxes with {b} {item}s in each and gives away {c}. how many {item}s are left?"
        work, n = f"{a} * {b} = {a * b}, {a * b} - {c} = {a * b - c}", a * b - c
    else:
        raise ValueError(f"unknown transfer kind {kind!r}; known: {', '.join(TRANSFER_KINDS)}")
    return q, f"{name} works it out: {work} {item}s.\n#### {n}"


def transfer_rows(spec: SyntheticDataSpec) -> list[dict[str, str]]:
    """The ``transfer`` split's rows: ``spec.transfer_size`` distinct problems, the kinds in turn (so each
    kind has its share), from a random stream of their own (``kind`` names each row's)."""
    rng = random.Random(f"gsm8k_style:{spec.seed}:transfer")
    seen: set[str] = set()
    rows: list[dict[str, str]] = []
    for _ in range(50 * spec.transfer_size):
        if len(rows) == spec.transfer_size:
            break
        kind = TRANSFER_KINDS[len(rows) % len(TRANSFER_KINDS)]
        q, a = make_transfer_problem(rng, spec.max_value, kind)
        if q not in seen:
            seen.add(q)
            rows.append({"question": q, "answer": a, "kind": kind})
    if len(rows) < spec.transfer_size:
        raise ValueError(
            f"max_value={spec.max_value} allows only {len(rows)} distinct transfer problems; raise it"
        )
    return rows


# The dataset card that names the splits when the folder holds a transfer split (datasets' own layout
# rules know train/test/validation file names only): the hub's `configs` / `data_files` form.
_CARD = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: train.parquet
  - split: test
    path: test.parquet
  - split: transfer
    path: transfer.parquet
---
A GSM8K-format dataset generated by rl_engine (data.synthetic), with a transfer split.
"""


def write_dataset(spec: SyntheticDataSpec, out_dir: str | Path) -> Path:
    """Write ``train.parquet`` and ``test.parquet`` into ``out_dir`` (built in a temporary sibling and
    renamed into place, so racing builders both end with a complete directory). Deterministic."""
    import datasets

    datasets.disable_progress_bars()
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"gsm8k_style:{spec.seed}")
    seen: set[str] = set()
    rows: list[dict[str, str]] = []
    # Distinct questions, so the test split is truly held out from the train split.
    for _ in range(50 * (spec.train_size + spec.test_size)):
        if len(rows) == spec.train_size + spec.test_size:
            break
        q, a = make_problem(rng, spec.max_value)
        if q not in seen:
            seen.add(q)
            rows.append({"question": q, "answer": a})
    if len(rows) < spec.train_size + spec.test_size:
        raise ValueError(f"max_value={spec.max_value} allows only {len(rows)} distinct problems; raise it")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        datasets.Dataset.from_list(rows[: spec.train_size]).to_parquet(str(tmp / "train.parquet"))
        datasets.Dataset.from_list(rows[spec.train_size :]).to_parquet(str(tmp / "test.parquet"))
        if spec.transfer_size:
            _write_transfer(spec, tmp)
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "train.parquet").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another builder won the race with the same content
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_transfer(spec: SyntheticDataSpec, folder: Path) -> None:
    import datasets

    datasets.Dataset.from_list(transfer_rows(spec)).to_parquet(str(folder / "transfer.parquet"))
    (folder / "README.md").write_text(_CARD)


def add_transfer(spec: SyntheticDataSpec, out_dir: str | Path) -> None:
    """Give a folder ``write_dataset`` wrote without a transfer split its ``transfer`` split and card
    (both written beside it and renamed into place; the train and test files are left as they are)."""
    out = Path(out_dir)
    if not spec.transfer_size or ((out / "transfer.parquet").exists() and (out / "README.md").exists()):
        return
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.transfer-", dir=out.parent))
    try:
        _write_transfer(spec, tmp)
        os.replace(tmp / "transfer.parquet", out / "transfer.parquet")
        os.replace(tmp / "README.md", out / "README.md")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

"""A small GSM8K-format dataset generated locally: word problems whose solutions end in ``#### N``.

Same columns as ``openai/gsm8k`` (``question``, ``answer``), same answer convention, written as a data
directory laid out like the hub repository (``train.parquet``, ``test.parquet``), so the CPU preset
runs the exact path the GPU preset takes with the real dataset. Lower case only and short numbers: the
tiny model's character vocabulary has no upper case, and a CPU run should see rewards within minutes.
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

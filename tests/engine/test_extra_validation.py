"""Extra held-out splits (``data.extra_validation_splits``) and the generated ``transfer`` split: problems the
train split never shows, evaluated beside the validation prompts, each on its own (``val/<split>/...``).
Real parquet files, the real tiny model and HF worker, greedy decoding."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rl_engine.backends import build_rollout_worker
from rl_engine.config import ConfigError, RewardConfig, SyntheticDataSpec
from rl_engine.data import extra_validation_prompts
from rl_engine.data.gsm8k_style import TRANSFER_KINDS, write_dataset
from rl_engine.evaluation import Evaluator
from rl_engine.rewards import build_reward

# the train split's three wordings (rl_engine.data.gsm8k_style.make_problem), written out again here
TRAIN_WORDINGS = [
    r"\w+ has \d+ \w+s and gets \d+ more\. how many \w+s does \w+ have now\?",
    r"\w+ has \d+ \w+s and gives away \d+\. how many \w+s are left\?",
    r"\w+ buys \d+ boxes with \d+ \w+s in each\. how many \w+s is that\?",
]
# each transfer kind's answer from the numbers in its question, in order
ANSWER_OF = {
    "add_reworded": lambda a, b: a + b,
    "sub_reworded": lambda a, b: a - b,
    "mul_reworded": lambda a, b: a * b,
    "add_then_sub": lambda a, b, c: a + b - c,
    "mul_then_sub": lambda a, b, c: a * b - c,
}
LETTER_FIRST = RewardConfig(name="format", kwargs={"pattern": "[a-z].*"})


def _rows(path: Path) -> list[dict]:
    import datasets

    return datasets.Dataset.from_parquet(str(path)).to_list()


def test_the_transfer_split_holds_other_wordings_and_two_step_problems_never_in_train(tmp_path):
    spec = SyntheticDataSpec(train_size=300, test_size=20, max_value=20, seed=3, transfer_size=40)
    out = write_dataset(spec, tmp_path / "d")
    train, test, transfer = (_rows(out / f"{s}.parquet") for s in ("train", "test", "transfer"))
    assert len(transfer) == 40 and len({r["question"] for r in transfer}) == 40
    counts = {k: sum(r["kind"] == k for r in transfer) for k in TRANSFER_KINDS}
    assert set(counts.values()) == {8}  # every kind its share
    seen = {r["question"] for r in train + test}
    for r in transfer:
        assert r["question"] not in seen
        assert not any(re.fullmatch(w, r["question"]) for w in TRAIN_WORDINGS), r["question"]
        numbers = [int(x) for x in re.findall(r"\d+", r["question"])]
        expected = ANSWER_OF[r["kind"]](*numbers)
        assert r["answer"].endswith(f"#### {expected}") and expected >= 0, r
    # every train question is one of the train wordings (the regexes above describe the split)
    assert all(any(re.fullmatch(w, r["question"]) for w in TRAIN_WORDINGS) for r in train)
    # the train and test splits are those of the same spec without a transfer split, row for row
    plain = write_dataset(spec.model_copy(update={"transfer_size": 0}), tmp_path / "plain")
    assert _rows(plain / "train.parquet") == train and _rows(plain / "test.parquet") == test
    assert not (plain / "transfer.parquet").exists() and not (plain / "README.md").exists()
    # deterministic
    again = write_dataset(spec, tmp_path / "again")
    assert _rows(again / "transfer.parquet") == transfer


def _data(path: Path, tmp_path: Path, **extra) -> str:
    spec = {
        "source": "dataset",
        "path": str(path),
        "cache_dir": str(tmp_path / "hf-cache"),
        "columns": {"prompt": "question", "answer": "answer"},
        "chat_template": "off",
        "validation_split": "test",
        **extra,
    }
    return "data=" + json.dumps(spec)


def test_a_folder_generated_before_gets_its_transfer_split_when_asked(tmp_path, make_cfg):
    synthetic = {"train_size": 50, "test_size": 6, "max_value": 9, "seed": 0}
    folder = tmp_path / "arith"
    write_dataset(SyntheticDataSpec(**synthetic), folder)  # an older folder: no transfer split
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    cfg = make_cfg(
        _data(
            folder,
            tmp_path,
            synthetic={**synthetic, "transfer_size": 10},
            extra_validation_splits=["transfer"],
        ),
        "rollout.max_prompt_tokens=200",
    )
    from rl_engine.models import load_tokenizer

    sets = extra_validation_prompts(cfg, load_tokenizer(cfg.model))
    assert list(sets) == ["transfer"] and len(sets["transfer"]) == 10
    assert [p.uid for p in sets["transfer"]][:2] == ["transfer/v0", "transfer/v1"]
    rows = _rows(folder / "transfer.parquet")
    assert [p.answer for p in sets["transfer"]] == [r["answer"] for r in rows]
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.name in before} == before  # untouched


def test_each_extra_split_is_evaluated_as_if_it_were_the_only_held_out_set(tmp_path, make_cfg):
    synthetic = {"train_size": 50, "test_size": 5, "max_value": 9, "seed": 1, "transfer_size": 7}
    folder = tmp_path / "arith"
    common = ("rollout.max_prompt_tokens=200", "rollout.max_new_tokens=6", "eval.every=1")
    cfg = make_cfg(
        _data(folder, tmp_path, synthetic=synthetic, extra_validation_splits=["transfer"]),
        *common,
        "eval.prompts_per_call=4",
    )
    worker = build_rollout_worker(cfg)
    ev = Evaluator.from_config(cfg, worker.tokenizer, build_reward(LETTER_FIRST))
    assert ev is not None and [len(c) for c in ev.chunks(ev.extra_sets["transfer"])] == [4, 3]
    result = ev.run(worker)
    m = result.metrics
    # the references: the test split alone, and the transfer split as a run's only validation split
    alone = make_cfg(_data(folder, tmp_path, synthetic=synthetic), *common)
    only_transfer = make_cfg(
        _data(folder, tmp_path, synthetic=synthetic, validation_split="transfer"), *common
    )
    for reference, prefix in ((alone, "val/"), (only_transfer, "val/transfer/")):
        ref = Evaluator.from_config(reference, worker.tokenizer, build_reward(LETTER_FIRST))
        assert ref is not None and not ref.extra_sets
        ref_m = ref.run(worker).metrics
        for name in ("pass@1", "reward_mean", "response_length", "truncated_ratio", "num_prompts"):
            assert m[prefix + name] == pytest.approx(ref_m["val/" + name]), (prefix, name)
    assert m["val/num_prompts"] == 5 and m["val/transfer/num_prompts"] == 7
    assert len(result.samples) == 5  # the validation prompts' samples
    assert "val/transfer/time_s" not in m and "val/transfer/param_version" not in m


@pytest.mark.parametrize(
    ("splits", "message"),
    [
        (["test"], "'test' is already the train or validation split"),
        (["train"], "'train' is already the train or validation split"),
        (["a b"], "is not a split name"),
        (["x", "x"], "each split at most once"),
        ([f"s{i}" for i in range(9)], "at most 8"),
    ],
)
def test_bad_extra_splits_are_refused_at_their_field(splits, message, tmp_path, make_cfg):
    with pytest.raises(ConfigError) as err:
        make_cfg(_data(tmp_path / "d", tmp_path, extra_validation_splits=splits))
    assert "data.extra_validation_splits" in str(err.value) and message in str(err.value)


def test_a_missing_extra_split_is_a_one_line_data_error(tmp_path, make_cfg):
    from rl_engine.data import DataError
    from rl_engine.models import load_tokenizer

    folder = write_dataset(SyntheticDataSpec(train_size=20, test_size=4, max_value=9), tmp_path / "d")
    cfg = make_cfg(_data(folder, tmp_path, extra_validation_splits=["hard"]), "rollout.max_prompt_tokens=200")
    with pytest.raises(DataError, match="no split 'hard'"):
        extra_validation_prompts(cfg, load_tokenizer(cfg.model))

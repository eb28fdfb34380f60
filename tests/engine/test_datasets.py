"""Hugging Face ``datasets`` as a prompt source: formats, column mapping, splits, seeded epochs, a resumable
cursor, chat templates and the overlong-prompt policy — on real files and the real tiny tokenizer."""

from __future__ import annotations

import collections
import json
import os
import re
from pathlib import Path

import pytest

from rl_engine.config import SyntheticDataSpec, parse_config
from rl_engine.data import DataError, PromptStream, validation_prompts
from rl_engine.data.gsm8k_style import write_dataset
from rl_engine.models import load_tokenizer
from rl_engine.models.tiny import build_char_tokenizer

QUESTIONS = [f"what is {a} + {b}?" for a, b in [(1, 2), (3, 4), (5, 1), (2, 2), (6, 3), (7, 1), (4, 4)]]
ROWS = [
    {"question": q, "solution": f"#### {sum(map(int, q[8:-1].split(' + ')))}", "level": i % 3}
    for i, q in enumerate(QUESTIONS)
]


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


@pytest.fixture
def parquet_files(tmp_path: Path) -> tuple[Path, Path]:
    train = _write_parquet(tmp_path / "train.parquet", ROWS)
    val = _write_parquet(
        tmp_path / "val.parquet", [{"question": "what is 9 + 9?", "solution": "#### 18", "level": 2}]
    )
    return train, val


def _data(path: Path, tmp_path: Path, **extra) -> str:
    # plain text unless a test asks for the chat template (the tiny tokenizer has one: auto would use it)
    spec = {
        "source": "dataset",
        "path": str(path),
        "cache_dir": str(tmp_path / "hf-cache"),
        "columns": {"prompt": "question", "answer": "solution"},
        "chat_template": "off",
        **extra,
    }
    return "data=" + json.dumps(spec)


def test_parquet_with_column_mapping_covers_every_row_once_per_seeded_epoch(
    parquet_files, tmp_path, make_cfg
):
    train, val = parquet_files
    cfg = make_cfg(
        _data(
            train,
            tmp_path,
            validation_path=str(val),
            columns={"prompt": "question", "answer": "solution", "metadata": ["level"]},
        ),
        "seed=3",
    )
    tok = load_tokenizer(cfg.model)
    stream = PromptStream(cfg, tok)
    assert len(stream) == 7
    epochs = [stream.next_batch(7) for _ in range(3)]
    for epoch in epochs:
        assert sorted(p.text for p in epoch) == sorted(QUESTIONS)  # every row exactly once per epoch
    assert [p.text for p in epochs[0]] != [p.text for p in epochs[1]]  # each epoch its own order
    assert [p.text for p in epochs[0]] != QUESTIONS  # shuffled
    first = epochs[0][0]
    row = ROWS[QUESTIONS.index(first.text)]
    assert first.answer == row["solution"] and first.metadata == {"level": row["level"]}
    assert first.token_ids == list(tok(first.text)["input_ids"])  # no chat template: plain encoding
    assert [p.uid for p in epochs[1]] == [f"p{i}" for i in range(7, 14)]
    # the same seed gives the same order; another seed another one
    again = PromptStream(cfg, tok).next_batch(7)
    assert [p.text for p in again] == [p.text for p in epochs[0]]
    other = PromptStream(make_cfg(_data(train, tmp_path), "seed=4"), tok).next_batch(7)
    assert [p.text for p in other] != [p.text for p in epochs[0]]
    in_order = PromptStream(make_cfg(_data(train, tmp_path, shuffle=False)), tok).next_batch(7)
    assert [p.text for p in in_order] == QUESTIONS
    held_out = validation_prompts(cfg, tok)
    assert [(p.uid, p.text, p.answer) for p in held_out] == [("v0", "what is 9 + 9?", "#### 18")]


def test_resumed_stream_continues_the_epoch_without_repeating_or_skipping(parquet_files, tmp_path, make_cfg):
    cfg = make_cfg(_data(parquet_files[0], tmp_path), "seed=11")
    tok = load_tokenizer(cfg.model)
    reference = PromptStream(cfg, tok).next_batch(18)  # 2.5 epochs without interruption
    for cut in (3, 7, 10):  # mid-epoch, at an epoch boundary, in the second epoch
        a = PromptStream(cfg, tok)
        before = a.next_batch(cut)
        state = json.loads(json.dumps(a.state_dict()))  # what a checkpoint keeps
        b = PromptStream(cfg, tok)  # a new process after the restart
        b.load_state_dict(state)
        after = b.next_batch(18 - cut)
        assert before + after == reference
    counts = collections.Counter(p.text for p in reference[:14])
    assert set(counts.values()) == {2}  # two full epochs: each question exactly twice


def test_resume_with_different_data_is_refused(parquet_files, tmp_path, make_cfg):
    tok = load_tokenizer(make_cfg().model)
    a = PromptStream(make_cfg(_data(parquet_files[0], tmp_path)), tok)
    a.next_batch(2)
    smaller = PromptStream(make_cfg(_data(parquet_files[0], tmp_path, max_rows=5)), tok)
    with pytest.raises(DataError, match="had 7 rows per epoch, this data has 5"):
        smaller.load_state_dict(a.state_dict())
    legacy = PromptStream(make_cfg(_data(parquet_files[0], tmp_path)), tok)
    legacy.load_state_dict({"position": 2})  # checkpoints written before the cursor carried more
    assert legacy.position == 2


def test_jsonl_arrow_and_saved_dataset_formats(tmp_path, make_cfg):
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in ROWS))
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(saved))
    arrow_file = next((saved / "train").glob("*.arrow"))
    tok = load_tokenizer(make_cfg().model)
    for path, extra in [(jsonl, {}), (saved, {"validation_split": "test"}), (arrow_file, {})]:
        cfg = make_cfg(_data(path, tmp_path, **extra))
        texts = sorted(p.text for p in PromptStream(cfg, tok).next_batch(7))
        assert texts == sorted(QUESTIONS), path
    cfg = make_cfg(_data(saved, tmp_path, validation_split="test"))
    assert [p.text for p in validation_prompts(cfg, tok)] == [QUESTIONS[0]]


def _cache_hub_dataset(tmp_path: Path, rows: list[dict]) -> None:
    """Stand-in for an earlier online `load_dataset("testorg/gsm8k_mini", "main")`: the same builder writes
    the same cache layout (<cache>/<org>___<name>/<config>/<version>/<hash>/*.arrow); there is no network."""
    from datasets.packaged_modules.parquet.parquet import Parquet

    src = _write_parquet(tmp_path / "src.parquet", rows)
    cache = tmp_path / "hf-cache"
    builder = Parquet(
        cache_dir=str(cache),
        dataset_name="gsm8k_mini",
        config_name="main",
        data_files={"train": str(src), "test": str(src)},
        hash="0123abcd",
    )
    builder.download_and_prepare()
    cfg_dir = next((cache / "gsm8k_mini").iterdir())
    (cache / "testorg___gsm8k_mini").mkdir()
    cfg_dir.rename(cache / "testorg___gsm8k_mini" / "main")  # the hub's config directory name


def test_a_hub_dataset_from_the_local_cache_loads_offline(tmp_path, make_cfg):
    _cache_hub_dataset(tmp_path, ROWS)
    cfg = make_cfg(_data("testorg/gsm8k_mini", tmp_path, name="main", validation_split="test"))
    tok = load_tokenizer(cfg.model)
    assert sorted(p.text for p in PromptStream(cfg, tok).next_batch(7)) == sorted(QUESTIONS)
    assert len(validation_prompts(cfg, tok)) == 7
    missing = make_cfg(_data("testorg/not_cached", tmp_path))
    with pytest.raises(DataError, match=r"testorg/not_cached split 'train': .*offline: only local files"):
        PromptStream(missing, tok)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"columns": {"prompt": "q", "answer": "solution"}},
            r"no column 'q'; its columns: question, solution, level",
        ),
        ({"validation_split": "dev"}, r"is a single file, which holds one split: use data.validation_path"),
        ({"saved": True, "validation_split": "dev"}, r"saved: no split 'dev'; its splits: train"),
        ({"path": "/nonexistent/train.parquet"}, r"/nonexistent/train.parquet: no such file or directory"),
        ({"rename": ".data"}, r"cannot tell the format of .*train.data' from its extension; set data.format"),
    ],
)
def test_dataset_errors_are_one_line_and_name_what_is_wrong(
    parquet_files, tmp_path, make_cfg, extra, message
):
    from rl_engine.cli import runtime_problems

    extra = dict(extra)
    path = parquet_files[0]
    if "rename" in extra:
        path = path.rename(path.with_suffix(extra.pop("rename")))
    if extra.pop("saved", False):
        import datasets

        path = tmp_path / "saved"
        datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(path))
    cfg = make_cfg(_data(Path(extra.pop("path", path)), tmp_path, **extra))
    problems = runtime_problems(cfg)
    assert len(problems) == 1, problems
    field, msg = problems[0]
    assert field.startswith("data.") and "\n" not in msg
    assert re.search(message, msg), msg


# --- chat templates and prompt length -------------------------------------------------------------------


def test_the_tiny_tokenizer_carries_a_chat_template(tiny_model_dir: Path, make_cfg):
    tok = load_tokenizer(make_cfg().model)
    msgs = [{"role": "system", "content": "be brief."}, {"role": "user", "content": "what is 2+3?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<s>system: be brief.</s>user: what is 2+3?</s>assistant: "
    assert (tiny_model_dir / "chat_template.jinja").exists() or "chat_template" in json.loads(
        (tiny_model_dir / "tokenizer_config.json").read_text()
    )


def test_rows_go_through_the_chat_template_with_the_generation_prompt(tmp_path, make_cfg):
    rows = [
        {
            "messages": [{"role": "user", "content": "what is 1 + 2?"}],
            "answer": "3",
            "sys": "answer with a number.",
        }
    ]
    path = _write_parquet(tmp_path / "chat.parquet", rows)
    cfg = make_cfg(
        _data(
            path,
            tmp_path,
            columns={"prompt": None, "messages": "messages", "answer": "answer", "system": "sys"},
            chat_template="auto",
        ),
        "rollout.max_prompt_tokens=128",
    )
    tok = load_tokenizer(cfg.model)
    [p] = PromptStream(cfg, tok).next_batch(1)
    assert p.text == "<s>system: answer with a number.</s>user: what is 1 + 2?</s>assistant: "
    expected = tok.apply_chat_template(
        [
            {"role": "system", "content": "answer with a number."},
            {"role": "user", "content": "what is 1 + 2?"},
        ],
        add_generation_prompt=True,
        tokenize=True,
    )["input_ids"]
    assert p.token_ids == list(expected)
    assert p.token_ids.count(tok.bos_token_id) == 1  # the template's bos only, none added on top
    # a text column with a prompt template and a fixed system prompt; chat_template off keeps plain text
    cfg2 = make_cfg(
        _data(
            parquet_files_path(tmp_path),
            tmp_path,
            prompt_template="q: {prompt} think.",
            system_prompt="you add numbers.",
            chat_template="on",
        ),
        "rollout.max_prompt_tokens=128",
    )
    [q] = PromptStream(cfg2, tok).next_batch(1)
    assert q.text.startswith("<s>system: you add numbers.</s>user: q: what is ") and q.text.endswith(
        " think.</s>assistant: "
    )
    cfg3 = make_cfg(
        _data(parquet_files_path(tmp_path), tmp_path, prompt_template="q: {prompt}", chat_template="off")
    )
    [r] = PromptStream(cfg3, tok).next_batch(1)
    assert r.text.startswith("q: what is ")


def parquet_files_path(tmp_path: Path) -> Path:
    path = tmp_path / "plain.parquet"
    return path if path.exists() else _write_parquet(path, ROWS)


def test_chat_template_on_without_one_is_a_clear_error(tmp_path, make_cfg):
    tok = build_char_tokenizer()
    tok.chat_template = None
    cfg = make_cfg(_data(parquet_files_path(tmp_path), tmp_path, chat_template="on"))
    with pytest.raises(DataError, match=r"data.chat_template is 'on' but the tokenizer has no chat template"):
        PromptStream(cfg, tok)


def test_overlong_prompts_are_dropped_truncated_or_refused_and_always_counted(tmp_path, make_cfg):
    rows = [
        {"question": "short?", "solution": "1"},
        {"question": "a much longer question here?", "solution": "2"},
        {"question": "tiny?", "solution": "3"},
    ]
    path = _write_parquet(tmp_path / "mixed.parquet", rows)
    tok = load_tokenizer(make_cfg().model)
    limit = ["rollout.max_prompt_tokens=10"]

    def stream(**extra):
        return PromptStream(make_cfg(_data(path, tmp_path, shuffle=False, **extra), *limit), tok)

    drop = stream()
    got = drop.next_batch(4)  # rows 0, 2, 0, 2: the long one is skipped every epoch
    assert [p.text for p in got] == ["short?", "tiny?", "short?", "tiny?"]
    assert [p.uid for p in got] == ["p0", "p2", "p3", "p5"]
    assert drop.stats()["data/overlong_prompts"] == 2.0 and drop.state_dict()["overlong"] == 2
    left = stream(overlong_prompts="truncate", truncation_side="left").next_batch(2)[1]
    right = stream(overlong_prompts="truncate", truncation_side="right").next_batch(2)[1]
    full = tok("a much longer question here?")["input_ids"]
    assert left.token_ids == full[-10:] and left.text == "estion here?"[-10:]
    assert right.token_ids == full[:10] and right.text == "a much lon"
    with pytest.raises(DataError, match=r"row 1 has 28 tokens, more than rollout.max_prompt_tokens=10"):
        stream(overlong_prompts="error").next_batch(2)
    tiny_limit = PromptStream(make_cfg(_data(path, tmp_path), "rollout.max_prompt_tokens=2"), tok)
    with pytest.raises(DataError, match=r"every prompt is longer than rollout.max_prompt_tokens=2"):
        tiny_limit.next_batch(1)


# --- tasks and the generated GSM8K-style dataset ------------------------------------------------------------


def test_task_validation_prompts_come_from_their_own_seed_stream(make_cfg):
    cfg = make_cfg("data.task=add", "data.num_prompts=50", "data.num_validation_prompts=20")
    tok = load_tokenizer(cfg.model)
    val = validation_prompts(cfg, tok)
    assert [p.uid for p in val] == [f"v{i}" for i in range(20)]
    train = {p.text for p in PromptStream(cfg, tok).next_batch(50)}
    assert len({p.text for p in val} - train) >= 15  # a different stream, not the first training prompts
    assert validation_prompts(make_cfg(), tok) == []
    assert len(validation_prompts(cfg, tok, max_prompts=5)) == 5


def test_generated_gsm8k_style_dataset_is_deterministic_and_held_out(tmp_path):
    from rl_engine.config import RewardConfig
    from rl_engine.data.hf_datasets import load_split
    from rl_engine.rewards import build_reward
    from rl_engine.types import Sample

    spec = SyntheticDataSpec(train_size=300, test_size=30, seed=1)
    a, b = write_dataset(spec, tmp_path / "a"), write_dataset(spec, tmp_path / "b")
    assert (a / "train.parquet").read_bytes() == (b / "train.parquet").read_bytes()
    cfg = parse_config(
        {
            "model": {"path": "x"},
            "data": {
                "source": "dataset",
                "path": str(a),
                "cache_dir": str(tmp_path / "c"),
                "validation_split": "test",
                "columns": {"prompt": "question", "answer": "answer"},
            },
        }
    )
    train, test = load_split(cfg.data, str(a), "train"), load_split(cfg.data, str(a), "test")
    assert (len(train), len(test)) == (300, 30)
    assert not set(train["question"]) & set(test["question"])
    reward = build_reward(RewardConfig(name="math_verify", kwargs={"answer_format": "gsm8k"}))
    for row in test:
        assert row["question"] == row["question"].lower() and row["answer"].split("\n")[-1].startswith(
            "#### "
        )
        final = row["answer"].rsplit("#### ", 1)[1]
        sample = Sample(
            "p", "p", [1], [2], [0.0], "stop", 0, 0, response_text=f"#### {final}", answer=row["answer"]
        )
        assert reward(sample) == 1.0
        wrong = Sample(
            "p",
            "p",
            [1],
            [2],
            [0.0],
            "stop",
            0,
            0,
            response_text=f"#### {int(final) + 1}",
            answer=row["answer"],
        )
        assert reward(wrong) == 0.0


def test_synthetic_dataset_is_built_once_when_missing(tmp_path, make_cfg):
    path = tmp_path / "gen"
    cfg = make_cfg(
        _data(
            path,
            tmp_path,
            columns={"prompt": "question", "answer": "answer"},
            validation_split="test",
            synthetic={"train_size": 40, "test_size": 8},
        ),
        "rollout.max_prompt_tokens=256",
    )
    tok = load_tokenizer(cfg.model)
    assert len(PromptStream(cfg, tok)) == 40 and len(validation_prompts(cfg, tok)) == 8
    mtime = os.stat(path / "train.parquet").st_mtime_ns
    PromptStream(cfg, tok)
    assert os.stat(path / "train.parquet").st_mtime_ns == mtime


def test_the_hf_datasets_form_of_a_hub_id_never_reads_a_local_folder(tmp_path, make_cfg, monkeypatch):
    """`namespace/name` may be a folder of the working directory (datasets' own rule); in the form
    hf://datasets/namespace/name it is the hub's (here: the cache's) dataset only. The platform gives hub
    ids to the engine in that form, so a config cannot read the job's working directory through one."""
    _cache_hub_dataset(tmp_path, ROWS)
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "testorg" / "gsm8k_mini"
    local.mkdir(parents=True)
    _write_parquet(
        local / "train.parquet", [{"question": "a local secret", "solution": "#### 1", "level": 0}]
    )
    tok = load_tokenizer(make_cfg().model)
    as_folder = make_cfg(_data("testorg/gsm8k_mini", tmp_path))
    assert [p.text for p in PromptStream(as_folder, tok).next_batch(1)] == ["a local secret"]
    hub_only = make_cfg(
        _data("hf://datasets/testorg/gsm8k_mini", tmp_path, name="main", validation_split="test")
    )
    assert sorted(p.text for p in PromptStream(hub_only, tok).next_batch(7)) == sorted(QUESTIONS)
    assert len(validation_prompts(hub_only, tok)) == 7
    generated = make_cfg(_data("hf://datasets/testorg/new", tmp_path, synthetic={"train_size": 4}))
    with pytest.raises(DataError, match=r"data\.synthetic writes a local dataset directory"):
        PromptStream(generated, tok)
    assert not (tmp_path / "hf:").exists()

"""Built-in tasks, the JSONL loader and the prompt stream (determinism, resume position)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rl_engine.data import DataError, PromptStream, load_jsonl, make_task
from rl_engine.models import load_tokenizer


@pytest.mark.parametrize(
    ("task", "check"),
    [
        ("copy", lambda p, a: p == f"copy {a}:"),
        ("next_digit", lambda p, a: (int(p.split()[1][0]) + 1) % 10 == int(a)),
        ("add_mod10", lambda p, a: (int(p[0]) + int(p[2])) % 10 == int(a)),
        ("reverse", lambda p, a: p[4:-1][::-1] == a),
        ("add", lambda p, a: sum(int(x) for x in p[:-1].split("+")) == int(a)),
    ],
)
def test_task_answers_are_correct_and_prompts_short(task, check):
    fn = make_task(task, {})
    rng = random.Random(0)
    for _ in range(50):
        prompt, answer = fn(rng)
        assert check(prompt, answer), (prompt, answer)
        assert len(prompt) <= 20


def test_unknown_task_and_bad_kwargs_are_clear_errors():
    with pytest.raises(ValueError, match="unknown task 'nope'; choose one of"):
        make_task("nope", {})
    with pytest.raises(ValueError, match="takes no argument size; its arguments: length, alphabet"):
        make_task("reverse", {"size": 3})
    with pytest.raises(ValueError, match="digits must be between"):
        make_task("add", {"digits": 0})


def test_prompt_stream_is_deterministic_and_resumes_from_its_position(make_cfg):
    cfg = make_cfg("seed=5", "data.num_prompts=7")
    tok = load_tokenizer(cfg.model)
    a = PromptStream(cfg, tok)
    first = a.next_batch(5)
    state = a.state_dict()
    rest = a.next_batch(6)
    b = PromptStream(cfg, tok)
    b.load_state_dict(state)
    assert b.next_batch(6) == rest
    assert [p.uid for p in first] == [f"p{i}" for i in range(5)]
    assert first[0].token_ids == list(tok(first[0].text)["input_ids"])
    # num_prompts=7: the stream cycles over 7 distinct examples.
    assert rest[2].text == first[0].text and rest[2].uid != first[0].uid
    other_seed = PromptStream(make_cfg("seed=6", "data.num_prompts=7"), tok).next_batch(5)
    assert [p.text for p in other_seed] != [p.text for p in first]


def test_jsonl_stream_covers_every_record_each_epoch(tmp_path: Path, make_cfg):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"q": f"q{i}?", "a": i}) for i in range(5)) + "\n\n")
    cfg = make_cfg(f'data={{source: jsonl, path: "{path}", prompt_field: q, answer_field: a}}')
    stream = PromptStream(cfg, load_tokenizer(cfg.model))
    epoch1, epoch2 = stream.next_batch(5), stream.next_batch(5)
    assert sorted(p.answer for p in epoch1) == ["0", "1", "2", "3", "4"]
    assert sorted(p.text for p in epoch2) == sorted(p.text for p in epoch1)
    assert len(stream) == 5


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": "a", "answer": "1"}\n{"prompt": "b"\n', r"d.jsonl:2: not valid JSON"),
        ('{"prompt": "a", "answer": "1"}\n\n[1, 2]\n', r"d.jsonl:3: expected a JSON object, got list"),
        ('{"prompt": "a"}\n', r"d.jsonl:1: missing field 'answer'"),
        ('{"prompt": 3, "answer": "1"}\n', r"d.jsonl:1: field 'prompt' must be a non-empty string"),
        ("\n\n", r"d.jsonl: no records"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path: Path, content: str, message: str):
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        load_jsonl(path)


def test_jsonl_missing_file(tmp_path: Path):
    with pytest.raises(DataError, match="cannot read"):
        load_jsonl(tmp_path / "missing.jsonl")

"""The model catalogue reads files the platform did not write (``rl_engine/catalogue.py``): a model
folder's ``config.json``, safetensors headers, tokenizer files and card may be links to files elsewhere,
FIFOs, alias bombs, or nested deeper than a parser recurses. Each is read only as a regular file inside
its root, bounded, and a bad one makes the model show as unreadable instead of raising or hanging.
Real files on disk: symlinks, ``os.mkfifo``, deep nesting."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from rl_engine.catalogue import CatalogueError, describe, list_models, safetensors_parameters

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "num_attention_heads": 1, "num_hidden_layers": 2, "vocab_size": 50}  # fmt: skip
SECRET = "the-other-projects-secret"


def _safetensors(path: Path, header: bytes | None = None) -> None:
    """One float32 tensor of shape [2, 3] (6 parameters), or the ``header`` given as it is."""
    if header is None:
        header = json.dumps({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 24)


def write_model(folder: Path, card: str | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    _safetensors(folder / "model.safetensors")
    if card is not None:
        (folder / "README.md").write_text(card)
    return folder


def _answer(info) -> str:
    """What ``GET /api/models`` renders of the model (strict JSON: a date or bytes would raise)."""
    return json.dumps(info.as_dict(), allow_nan=False)


def test_files_linked_to_outside_the_root_are_not_read(tmp_path):
    root, outside = tmp_path / "models", tmp_path / "outside"
    outside.mkdir()
    (outside / "card.md").write_text(f"---\nlicense: {SECRET}\n---\n")
    (outside / "config.json").write_text(json.dumps({**CONFIG, "model_type": SECRET}))
    (outside / "tokenizer_config.json").write_text(json.dumps({"chat_template": SECRET}))
    _safetensors(outside / "weights.safetensors")
    model = write_model(root / "m")
    (model / "config.json").unlink()
    (model / "model.safetensors").unlink()
    (model / "config.json").symlink_to(outside / "config.json")
    (model / "README.md").symlink_to(outside / "card.md")
    (model / "tokenizer_config.json").symlink_to(outside / "tokenizer_config.json")
    (model / "model.safetensors").symlink_to(outside / "weights.safetensors")

    (info,) = list_models([root])
    assert SECRET not in _answer(info)
    assert (info.card, info.model_type, info.architecture) == ({}, None, None)
    assert info.parameters is None and info.chat_template is False
    assert {"README.md", "config.json", "model.safetensors", "tokenizer_config.json"} <= {
        p.split(":")[0] for p in info.unreadable
    }
    assert str(outside) not in _answer(info)  # the reason names the file, not where it leads


def test_a_link_that_stays_inside_the_root_is_read(tmp_path):
    root = tmp_path / "models"
    (root / "shared").mkdir(parents=True)  # no config.json: no model of its own
    (root / "shared" / "card.md").write_text("---\nlicense: apache-2.0\n---\n")
    model = write_model(root / "m")
    (model / "README.md").symlink_to(root / "shared" / "card.md")
    (info,) = list_models([root])
    assert info.card == {"license": "apache-2.0"} and info.unreadable == []


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "name", ["model.safetensors", "README.md", "tokenizer_config.json", "chat_template.jinja", "config.json"]
)
def test_a_fifo_among_a_models_files_does_not_hang_the_catalogue(tmp_path, name):
    root = tmp_path / "models"
    model = write_model(root / "m")
    (model / name).unlink(missing_ok=True)
    os.mkfifo(model / name)
    infos = list_models([root])
    if name == "config.json":  # no regular config.json: not a model directory
        assert infos == []
        with pytest.raises(CatalogueError):
            describe(model)
        return
    (info,) = infos
    assert any(p.startswith(f"{name}:") and "not a regular file" in p for p in info.unreadable)
    assert safetensors_parameters(model / "model.safetensors", root=root) in (None, 6)
    _answer(info)


DEEP = 100_000


def _deep_json() -> str:
    return '{"a": ' * DEEP + "1" + "}" * DEEP


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "case",
    [
        "deep config.json",
        "deep safetensors header",
        "deep tokenizer_config.json",
        "deep card (flow)",
        "deep card (block)",
        "date as a key",
        "date as a value",
        "number as a key",
        "binary value",
        "not a number",
        "python tag",
    ],
)
def test_a_hostile_file_makes_the_model_unreadable_never_an_error(tmp_path, case):
    root = tmp_path / "models"
    model = write_model(root / "m")
    cards = {
        "deep card (flow)": "---\nx: " + "[" * DEEP + "]" * DEEP + "\n---\n",
        "deep card (block)": "---\n" + "".join(" " * i + "a:\n" for i in range(3000)) + "---\n",
        "date as a key": "---\n2024-01-01: released\n---\n",
        "date as a value": "---\nreleased: 2024-01-01\n---\n",
        "number as a key": "---\n1: one\n---\n",
        "binary value": "---\nx: !!binary /w==\n---\n",
        "not a number": "---\nx: .nan\n---\n",
        "python tag": "---\nx: !!python/object/apply:os.system ['true']\n---\n",
    }
    if case == "deep config.json":
        (model / "config.json").write_text(_deep_json())
    elif case == "deep safetensors header":
        _safetensors(model / "model.safetensors", _deep_json().encode())
    elif case == "deep tokenizer_config.json":
        (model / "tokenizer_config.json").write_text(_deep_json())
    else:
        (model / "README.md").write_text(cards[case])
    (info,) = list_models([root])
    text = _answer(info)
    if case.startswith("date"):  # a date stays the text written: no error, nothing lost
        assert info.card in ({"released": "2024-01-01"}, {"2024-01-01": "released"}), info.card
        assert info.unreadable == []
        return
    assert info.unreadable and len(text) < 10_000
    if case == "deep config.json":
        assert info.architecture is None
    elif case == "deep safetensors header":
        assert info.parameters is None
    elif case != "deep tokenizer_config.json":
        assert info.card == {}


BOMB = (
    "---\n"
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "---\n"
)


@pytest.mark.timeout(60)
def test_an_alias_bomb_in_a_card_is_refused_not_expanded(tmp_path):
    root = tmp_path / "models"
    write_model(root / "m", card=BOMB)
    (info,) = list_models([root])
    assert info.card == {} and any("alias" in p for p in info.unreadable), info.unreadable
    assert len(_answer(info)) < 10_000  # expanded, the card alone is ~7 MB of JSON


def test_what_a_card_contributes_to_the_answer_is_bounded(tmp_path):
    root = tmp_path / "models"
    items = "".join(f"- item number {i} of a long list in a card\n" for i in range(20_000))  # ~800 KB
    write_model(root / "m", card=f"---\nlicense: mit\ntags:\n{items}---\n")
    write_model(root / "n", card="---\nlicense: mit\n---\n" + "body " * 400_000)  # a long body: fine
    m, n = list_models([root])
    assert m.card == {} and any("README.md" in p for p in m.unreadable)
    assert len(_answer(m)) < 10_000
    assert n.card == {"license": "mit"} and n.unreadable == []

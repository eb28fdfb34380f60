"""Model loading and the tiny-model builder: standard directory, exact tokenizer round trip, eos/pad rules."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rl_engine.config import ModelConfig, TinyModelSpec
from rl_engine.models import ensure_model, load_model, load_processor, load_tokenizer, special_token_ids
from rl_engine.models.tiny import save_tiny_model

REPO = Path(__file__).resolve().parents[2]


def test_tiny_model_dir_is_standard_and_loads_with_auto_classes(tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ]:
        assert (tiny_model_dir / name).exists(), name
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert sum(p.numel() for p in model.parameters()) < 10_000_000
    text = "copy k: 3+4 mod 10=7"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.padding_side == "left"


def test_builder_is_deterministic_and_seed_matters(tmp_path: Path):
    a = load_file(str(save_tiny_model(TinyModelSpec(seed=3), tmp_path / "a") / "model.safetensors"))
    b = load_file(str(save_tiny_model(TinyModelSpec(seed=3), tmp_path / "b") / "model.safetensors"))
    c = load_file(str(save_tiny_model(TinyModelSpec(seed=4), tmp_path / "c") / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_qwen2_tiny_model_keeps_its_char_tokenizer(tmp_path: Path):
    # transformers forces its own tokenizer class for qwen2; load_tokenizer must bypass it.
    cfg = ModelConfig(path=str(tmp_path / "q"), tiny=TinyModelSpec(architecture="qwen2"))
    ensure_model(cfg)
    tok = load_tokenizer(cfg)
    text = "rev abc: cba"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert type(load_model(cfg)).__name__ == "Qwen2ForCausalLM"


def test_ensure_model_concurrent_builders_both_get_a_complete_dir(tmp_path: Path):
    cfg = ModelConfig(path=str(tmp_path / "race"), tiny=TinyModelSpec())
    errors: list[BaseException] = []

    def build() -> None:
        try:
            ensure_model(cfg)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert load_model(cfg) is not None
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind


def test_missing_model_without_tiny_is_a_clear_error(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"set model\.tiny"):
        ensure_model(ModelConfig(path=str(tmp_path / "nope")))


def test_special_ids_prefer_generation_config_then_tokenizer(tiny_model_dir: Path, tmp_path: Path):
    cfg = ModelConfig(path=str(tiny_model_dir))
    tok = load_tokenizer(cfg)
    assert special_token_ids(cfg, tok).eos_ids == [tok.eos_token_id]
    # generation_config lists several eos ids (as chat models do): all of them count.
    d = tmp_path / "m"
    shutil.copytree(tiny_model_dir, d)
    gen = json.loads((d / "generation_config.json").read_text())
    gen["eos_token_id"] = [tok.eos_token_id, 5]
    (d / "generation_config.json").write_text(json.dumps(gen))
    assert special_token_ids(ModelConfig(path=str(d)), tok).eos_ids == [tok.eos_token_id, 5]
    # The config's own override wins over the file.
    over = ModelConfig(path=str(d), generation_config={"eos_token_id": 7, "pad_token_id": 9})
    assert special_token_ids(over, tok).eos_ids == [7]
    assert special_token_ids(over, tok).pad_id == 9


def test_model_without_generation_config_takes_ids_from_tokenizer(tiny_model_dir: Path, tmp_path: Path):
    d = tmp_path / "nogen"
    shutil.copytree(tiny_model_dir, d)
    (d / "generation_config.json").unlink()
    cfg = ModelConfig(path=str(d))
    tok = load_tokenizer(cfg)
    ids = special_token_ids(cfg, tok)
    assert ids.eos_ids == [tok.eos_token_id]
    assert ids.pad_id == tok.pad_token_id
    assert load_model(cfg) is not None


def test_tokenizer_only_dir_never_crashes_on_processor(tiny_model_dir: Path, tmp_path: Path):
    d = tmp_path / "tok-only"
    d.mkdir()
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(tiny_model_dir / name, d / name)
    cfg = ModelConfig(path=str(tiny_model_dir), tokenizer_path=str(d))
    tok = load_tokenizer(cfg)
    load_processor(ModelConfig(path=str(d)))  # may be None or a tokenizer: must not raise
    ids = special_token_ids(ModelConfig(path=str(d)), tok)  # no generation_config there either
    assert ids.eos_ids == [tok.eos_token_id]


def test_make_tiny_model_cli_writes_a_loadable_dir(tmp_path: Path):
    out = tmp_path / "cli-model"
    proc = subprocess.run(
        [sys.executable, "-m", "rl_engine", "make-tiny-model", str(out), "--arch", "qwen2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"
    again = subprocess.run(
        [sys.executable, "-m", "rl_engine", "make-tiny-model", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 1
    assert "already exists" in again.stderr and "Traceback" not in again.stderr

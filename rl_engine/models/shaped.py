"""Random-weight models with a real model's shapes, for the scale benchmark and the GPU check.

Shape decides memory and time, not the weights: ``save_shaped_model`` writes a standard model
directory (Qwen2 or Llama architecture, random init from a seed, the tiny model's character tokenizer,
eos id 2) that ``load_model`` / ``PolicyTrainer`` / ``HFRolloutWorker`` load like any other. Nothing is
downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Qwen2.5-0.5B: 494M parameters (tied embeddings), 151,936-token vocabulary.
QWEN25_05B: dict[str, Any] = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}


def save_shaped_model(
    path: Path, *, dtype: str = "bfloat16", seed: int = 0, architecture: str = "qwen2", **shape: Any
) -> Path:
    """Write a random model of ``QWEN25_05B`` overridden by ``shape`` to ``path``; returns it.
    ``architecture``: ``qwen2``, or ``llama`` (the same shape without Qwen2's q/k/v biases)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    from rl_engine.models.tiny import EOS_TOKEN, PAD_TOKEN, build_char_tokenizer, char_vocab

    configs = {"qwen2": Qwen2Config, "llama": LlamaConfig}
    if architecture not in configs:
        raise ValueError(f"architecture {architecture!r}: expected one of {sorted(configs)}")
    vocab = char_vocab()
    config = configs[architecture](
        **{**QWEN25_05B, **shape},
        pad_token_id=vocab[PAD_TOKEN],
        eos_token_id=vocab[EOS_TOKEN],
        bos_token_id=vocab[EOS_TOKEN],
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    build_char_tokenizer().save_pretrained(path)
    GenerationConfig(eos_token_id=vocab[EOS_TOKEN], pad_token_id=vocab[PAD_TOKEN]).save_pretrained(path)
    return path


__all__ = ["QWEN25_05B", "save_shaped_model"]

"""The blocks FSDP2 shards one by one (``rl_engine.trainer.distributed.decoder_layers``), found through
public structure only, against each architecture's own list of decoder layers."""

from __future__ import annotations

import pytest

from rl_engine.trainer.distributed import decoder_layers


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=100)  # fmt: skip
    model = LlamaForCausalLM(cfg)
    return model, list(model.model.layers)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, eos_token_id=0,
                                       bos_token_id=0))  # fmt: skip
    return model, list(model.transformer.h)


def _experts():
    """A model whose layers each hold a list of experts longer than the list of layers (transformers 5
    fuses its MoE experts into one module; older releases and other libraries keep a ModuleList)."""
    import torch

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(8))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.layers = torch.nn.ModuleList(Layer() for _ in range(2))

    model = Model()
    return model, list(model.layers)


@pytest.mark.parametrize("build", [_llama, _gpt2, _experts], ids=["llama", "gpt2", "experts"])
def test_the_sharded_blocks_are_the_decoder_layers(build):
    model, layers = build()
    found = decoder_layers(model)
    assert len(found) == len(layers) and all(a is b for a, b in zip(found, layers, strict=True))

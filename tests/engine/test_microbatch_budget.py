"""The default micro-batch token budget bounds what autograd saves, checked against what it saves.

The reference is autograd itself: ``torch.autograd.graph.saved_tensors_hooks`` sees every tensor a
forward keeps for the backward; their distinct storages (the parameters excluded) are the activation
memory of a micro-batch. The budget's per-token estimate must cover it for Llama and Qwen2 layers of
several widths, with and without gradient checkpointing, and not overstate it wildly (which would make
micro-batches needlessly small).
"""

from __future__ import annotations

import pytest
import torch

from rl_engine.trainer.microbatch import (
    ACTIVATION_BUDGET_BYTES,
    LOGITS_BUDGET_BYTES,
    MAX_TOKENS,
    MIN_TOKENS,
    ModelShape,
    default_token_budget,
)


def saved_activation_bytes(model: torch.nn.Module, tokens: int) -> int:
    """Bytes of the distinct storages autograd saves in one training forward of ``tokens`` tokens."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=ids, use_cache=False).last_hidden_state.sum().backward()
    return sum(storages.values())


SHAPES = [  # hidden, intermediate, heads, kv heads
    (576, 1536, 9, 3),  # SmolLM2-135M's widths
    (256, 1024, 4, 2),
    (512, 512, 8, 8),
    (384, 2048, 6, 1),
]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("hidden,intermediate,heads,kv", SHAPES)
@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
def test_the_estimate_covers_what_autograd_saves_per_token(
    arch, hidden, intermediate, heads, kv, checkpointed
):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[arch]
    layers = 2
    config = config_cls(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv, vocab_size=512,
                        attn_implementation="sdpa")  # fmt: skip
    torch.manual_seed(0)
    model = model_cls(config).train()
    if checkpointed:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # the per-token slope (what grows with the micro-batch), from two lengths
    measured = (saved_activation_bytes(model, 192) - saved_activation_bytes(model, 64)) / 128
    estimate = ModelShape.of(config, 512, checkpointed).activation_bytes_per_token()
    assert estimate is not None
    assert measured <= estimate <= 1.6 * measured, (measured, estimate)


def test_the_budget_is_the_smaller_bound_clamped():
    smollm2 = ModelShape(49152, num_layers=30, hidden_size=576, intermediate_size=1536)
    per_token = 4 * 30 * (12 * 576 + 4 * 1536) + 64
    assert default_token_budget(smollm2) == ACTIVATION_BUDGET_BYTES // per_token == 1370
    # a shallow model: the vocabulary's logits bound it
    tiny = ModelShape(152064, num_layers=2, hidden_size=64, intermediate_size=128)
    assert default_token_budget(tiny) == LOGITS_BUDGET_BYTES // (4 * 152064)
    # gradient checkpointing lifts the activation bound (Qwen2.5-1.5B's shape: the vocabulary decides)
    qwen = dict(vocab_size=151936, num_layers=28, hidden_size=1536, intermediate_size=8960)
    assert default_token_budget(ModelShape(**qwen)) == MIN_TOKENS
    assert default_token_budget(ModelShape(**qwen, gradient_checkpointing=True)) == 3533
    # a config without the sizes keeps the vocabulary rule; a tiny vocabulary hits the ceiling
    assert default_token_budget(ModelShape(49152)) == LOGITS_BUDGET_BYTES // (4 * 49152)
    assert default_token_budget(ModelShape(64)) == MAX_TOKENS


def test_the_trainer_budgets_with_the_models_own_depth_and_widths(tmp_path):
    """The trainer's budget comes from its model's shape, not only its vocabulary: a model deep and wide
    enough that its activations, not its logits, bound the micro-batch gets the activation bound,
    computed here by hand from the config (the reference), and a shallower one a larger budget."""
    from rl_engine.config import TinyModelSpec, parse_config
    from rl_engine.models.tiny import save_tiny_model
    from rl_engine.presets import get_preset
    from rl_engine.trainer import PolicyTrainer

    budgets = {}
    for layers in (8, 4):
        spec = TinyModelSpec(seed=0, hidden_size=256, intermediate_size=512, num_layers=layers, num_heads=4)
        data = get_preset("demo-cpu")
        data["model"] = {"path": str(save_tiny_model(spec, tmp_path / f"m{layers}"))}
        cfg = parse_config(data)
        trainer = PolicyTrainer(cfg)
        vocab = trainer.model.get_output_embeddings().weight.shape[0]
        per_token = 4 * layers * (12 * 256 + 4 * 512) + 64
        expected = max(
            MIN_TOKENS,
            min(MAX_TOKENS, LOGITS_BUDGET_BYTES // (4 * vocab), ACTIVATION_BUDGET_BYTES // per_token),
        )
        assert trainer.max_tokens == expected  # fmt: skip
        budgets[layers] = trainer.max_tokens
    assert budgets[8] < budgets[4] <= MAX_TOKENS  # the depth counts

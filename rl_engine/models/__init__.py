"""Models: loading a policy, its tokenizer and its special token ids from a typed ``ModelConfig``
(``loading``), the tiny model builder (``tiny``), and the tensor helpers of training and weight sync.
"""

from rl_engine.models.loading import (
    SpecialTokens,
    disable_dropout,
    ensure_model,
    load_model,
    load_processor,
    load_tokenizer,
    resolve_device,
    special_token_ids,
    torch_dtype,
    zero_dropout_modules,
)

__all__ = [
    "SpecialTokens",
    "disable_dropout",
    "ensure_model",
    "load_model",
    "load_processor",
    "load_tokenizer",
    "resolve_device",
    "special_token_ids",
    "torch_dtype",
    "zero_dropout_modules",
]

"""LoRA adapters on a loaded policy, through peft's public API (``model.lora``: ``rl_engine.config.lora``).

The trainer and the HF rollout worker wrap their model the same way (``add_adapters``), so their
parameter names are the same and an adapter-only sync (``adapter_parameters``) lands by name. peft's
``get_peft_model`` freezes every base weight (``requires_grad`` False) and leaves only the adapters
trainable; with ``init_lora_weights`` (peft's default) each ``lora_B`` starts at 0, so the wrapped model
computes exactly the base model's outputs until the first update.

Only linear layers inside the model's body are adapted: the output layer is refused (the trainer's
chunked output layer reads its weight directly, and a tied one is the embedding), and so is any module
that is not an ``nn.Linear``. A bad ``target_modules`` is a ``ConfigError`` at
``model.lora.target_modules``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from rl_engine.config import ConfigError
from rl_engine.config.lora import ALL_LINEAR, TARGETS_FIELD, LoraConfig, matches, unknown_targets

ADAPTER_DIR = "adapter"  # a LoRA checkpoint's adapters (peft's save_pretrained layout), and an export's


def peft_config(lora: LoraConfig) -> Any:  # -> peft.LoraConfig
    """peft's ``LoraConfig`` for ``model.lora`` (a causal LM; no bias trained)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import TaskType

    return PeftLoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules
        if isinstance(lora.target_modules, str)
        else list(lora.target_modules),
        bias="none",
    )


def check_targets(model: torch.nn.Module, lora: LoraConfig) -> None:
    """``lora.target_modules`` against ``model`` (an HF causal LM, not yet wrapped): every name matches a
    module, and every module it matches is an ``nn.Linear`` other than the output layer."""
    if lora.target_modules == ALL_LINEAR:
        return
    named = dict(model.named_modules())
    unknown = unknown_targets(lora, named)
    if unknown:
        leaves = sorted({n.rsplit(".", 1)[-1] for n, m in named.items() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(
            [
                (
                    TARGETS_FIELD,
                    f"the model has no module {unknown[0]!r}; its linear layers: {', '.join(leaves)}",
                )
            ]
        )
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for target in lora.target_modules:
        for name, module in named.items():
            if not matches(target, name):
                continue
            if module is head:
                raise ConfigError([(TARGETS_FIELD, f"{target!r} is the output layer ({name}): not adapted")])
            if type(module) is not torch.nn.Linear:
                raise ConfigError(
                    [
                        (
                            TARGETS_FIELD,
                            f"{target!r} matches {name}, a {type(module).__name__}: only linear layers",
                        )
                    ]
                )


def add_adapters(model: torch.nn.Module, lora: LoraConfig, seed: int) -> Any:  # -> peft.PeftModel
    """``model`` wrapped by ``peft.get_peft_model``: its weights frozen, adapters added (``lora_B`` = 0),
    on the device and in the dtype of the model's weights.

    ``lora_A``'s random initialisation is drawn from ``seed`` (the run's), the caller's random state
    left as it was: every rank of a trainer group starts from the same adapters (FSDP2 shards each
    rank's own copy) and a run from the same ones as its one-rank twin. (A rollout worker's need not
    be the trainer's: with ``lora_B`` = 0 any ``lora_A`` computes the base model, and a sync replaces both.)"""
    from peft import get_peft_model

    check_targets(model, lora)
    ref = next(model.parameters())
    cuda = [ref.device.index or 0] if ref.device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), warnings.catch_warnings():
        torch.manual_seed(seed)
        # peft 0.21 asks transformers 5.2x a deprecated question
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        wrapped = get_peft_model(model, peft_config(lora))
    for p in adapter_parameters(wrapped).values():
        p.data = p.data.to(device=ref.device, dtype=ref.dtype)
    return wrapped


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The trainable parameters (the adapters of a peft model) by name, in ``named_parameters`` order."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def save_adapters(model: Any, directory: Path) -> None:
    """peft's adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) of a peft model:
    what ``PeftModel.from_pretrained(base, directory)`` loads. The weights in their dtype (float32
    master weights in the trainer)."""
    model.save_pretrained(str(directory), safe_serialization=True, save_embedding_layers=False)


@torch.no_grad()
def load_adapters(model: Any, directory: Path) -> None:
    """The adapters of ``save_adapters``' folder into ``model`` (a peft model of the same config); every
    adapter weight must be there and nothing else."""
    from peft import load_peft_weights, set_peft_model_state_dict

    ref = next(iter(adapter_parameters(model).values()))
    result = set_peft_model_state_dict(model, load_peft_weights(str(directory), device=str(ref.device)))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{directory}: adapters do not fit the model (missing {missing[:3]}, "
            f"unexpected {list(result.unexpected_keys)[:3]})"
        )


class MergedWeights:
    """A peft model's weights with its adapters merged in, under the base model's names — what a rollout
    worker without adapters loads (``model.lora.sync: merged``): a ``PieceSource`` for a weight stream
    (``rl_engine.weights.buckets``), one weight merged at a time.

    An adapted linear layer's weight is ``W + delta``, ``delta`` peft's own ``get_delta_weight`` of the
    layer (``scaling * B @ A``, in the adapters' dtype), computed when the stream first reads the weight
    and kept until it reads another; every other weight is read as it is. The model is not changed (no
    ``merge_adapter``: the trainer goes on training the unmerged adapters)."""

    def __init__(self, model: Any):
        from peft.tuners.lora import LoraLayer

        base = model.get_base_model()
        layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
        self.tensors: dict[str, torch.Tensor] = {}
        self.adapted: dict[str, Any] = {}  # base name of an adapted weight -> its LoRA layer
        for name, param in base.named_parameters():
            if ".lora_" in name:
                continue
            owner, _, leaf = name.rpartition(".")
            if owner.endswith(".base_layer") and owner.removesuffix(".base_layer") in layers:
                module = owner.removesuffix(".base_layer")
                plain = f"{module}.{leaf}"
                if leaf == "weight":
                    self.adapted[plain] = layers[module]
            else:
                plain = name
            self.tensors[plain] = param
        self._name: str | None = None
        self._merged: torch.Tensor | None = None

    def shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every weight, in the base model's ``named_parameters`` order."""
        return [(n, tuple(t.shape)) for n, t in self.tensors.items()]

    def device_of(self, name: str) -> torch.device:
        return self.tensors[name].device

    @torch.no_grad()
    def merged(self, name: str) -> torch.Tensor:
        """Weight ``name`` as the rollout computes with it (the adapters merged in for an adapted one)."""
        base = self.tensors[name].detach()
        layer = self.adapted.get(name)
        if layer is None:
            return base
        if self._name != name:
            self._name, self._merged = None, None  # the previous merge goes before the next is made
            delta = sum(layer.get_delta_weight(a) for a in layer.active_adapters)
            self._name, self._merged = name, base + delta.to(base.dtype)
        assert self._merged is not None
        return self._merged

    def copy_piece(self, name: str, start: int, out: torch.Tensor) -> None:
        out.copy_(self.merged(name).reshape(-1)[start : start + out.numel()])

    def release(self) -> None:
        """Drop the merged weight kept for the stream's next pieces (after the last bucket)."""
        self._name, self._merged = None, None


__all__ = [
    "ADAPTER_DIR",
    "MergedWeights",
    "adapter_parameters",
    "add_adapters",
    "check_targets",
    "peft_config",
]

"""``model.lora``: train LoRA adapters (peft) instead of every weight (pydantic; imports neither torch nor peft).

With ``model.lora`` set the trainer wraps the policy with peft's ``get_peft_model``: the base weights are
frozen, AdamW holds the adapters only, a weight sync sends the adapters only, the KL reference is the
same model with its adapters disabled, and a checkpoint holds the adapters and their optimizer state
(docs/engine.md, "LoRA adapters").

The defaults are the ones RL practice uses, and why:

* ``rank`` 16, ``alpha`` 32 (peft scales the update by ``alpha / rank``: 2): verl's and OpenRLHF's
  examples train rank 8-64 with ``alpha`` = 2 x rank; RL's updates carry few bits per sample, so a small
  rank loses little against full fine-tuning.
* ``dropout`` 0: the trainer runs in training mode, where dropout would make every recomputation of the
  log-probs random, so the trainer's log-probs would no longer equal the rollout's (importance ratios
  != 1 on on-policy data). The engine turns the model's own dropout off for the same reason.
* ``target_modules`` ``all-linear``: peft's name for every linear layer but the output layer (on Llama,
  Qwen2, Mistral: ``q_proj k_proj v_proj o_proj gate_proj up_proj down_proj``), whatever the
  architecture calls them; adapting the MLP as well as attention is what learns closest to full
  fine-tuning, and verl and OpenRLHF default to it. The output layer and the embeddings are never
  adapted (the trainer's chunked output layer reads the head's weight directly).

``unknown_targets`` is the check of ``target_modules`` against a model's module names (the trainer
runs it on the model it loaded; anything that can list a model's modules can run it without torch).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from pydantic import Field, field_validator

from rl_engine.config.strict import StrictModel

ALL_LINEAR = "all-linear"
# The rollout backends that take an adapter-only sync (``adapters`` in ``rl_engine.backends.registry``;
# a test keeps the two equal). vLLM's LoRA requests and SGLang's adapter API are not wired yet: those
# backends get the merged weights (``LoraConfig.sync``).
LORA_BACKENDS = ("hf",)
SYNC_FIELD = "model.lora.sync"
TARGETS_FIELD = "model.lora.target_modules"
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


class LoraConfig(StrictModel):
    """LoRA adapters on the policy (peft's ``LoraConfig``: ``r``, ``lora_alpha``, ``lora_dropout``,
    ``target_modules``); see the module docstring for the defaults."""

    rank: int = Field(16, ge=1, le=1024, description="The adapters' rank r (peft's `r`).")
    alpha: float = Field(
        32.0, gt=0.0, le=65536.0, description="Scale of the update: alpha / rank (peft's `lora_alpha`)."
    )
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description=(
            "Dropout on the adapters' input in training mode. 0 keeps the trainer's log-probs equal to "
            "the rollout's; anything else makes every recomputation random."
        ),
    )
    target_modules: Literal["all-linear"] | list[str] = Field(
        ALL_LINEAR,
        description=(
            "all-linear: every linear layer but the output layer; or module names (a name matches a "
            "module whose dotted path ends with it: q_proj, v_proj, mlp.down_proj)."
        ),
    )

    sync: Literal["auto", "adapters", "merged"] = Field(
        "auto",
        description=(
            "What a weight sync sends. adapters: the adapters alone, applied by the rollout worker "
            "(rollout.backend hf); merged: every weight with the adapters merged in, under the base "
            "model's names (any backend; the whole model's bytes per sync); auto: adapters where the "
            "backend applies them, else merged."
        ),
    )

    @field_validator("target_modules")
    @classmethod
    def _names(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, str):
            return value
        if not value:
            raise ValueError(f"name at least one module, or {ALL_LINEAR!r}")
        if len(value) > 64:
            raise ValueError(f"at most 64 module names, got {len(value)}")
        bad = [v for v in value if not _MODULE_NAME.match(v)]
        if bad:
            shown = bad[0] if len(bad[0]) <= 80 else f"{bad[0][:80]}..."
            raise ValueError(
                f"{shown!r} is not a module name (letters, digits, _ and dots: q_proj, mlp.up_proj)"
            )
        if len(set(value)) != len(value):
            raise ValueError("a module is named twice")
        return value


def sync_mode(lora: LoraConfig | None, backend: str) -> Literal["adapters", "merged"] | None:
    """What a weight sync of a run with ``lora`` on rollout ``backend`` sends (None: no LoRA)."""
    if lora is None:
        return None
    if lora.sync == "auto":
        return "adapters" if backend in LORA_BACKENDS else "merged"
    return lora.sync


def matches(target: str, module: str) -> bool:
    """peft's rule for one name of ``target_modules``: the module's dotted path is it or ends with it."""
    return module == target or module.endswith(f".{target}")


def unknown_targets(lora: LoraConfig, module_names: Iterable[str]) -> list[str]:
    """The names of ``lora.target_modules`` that match none of ``module_names`` (a model's dotted module
    paths); ``all-linear`` matches whatever the model has."""
    if isinstance(lora.target_modules, str):
        return []
    names = list(module_names)
    return [t for t in lora.target_modules if not any(matches(t, m) for m in names)]

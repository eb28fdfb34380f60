"""Model loading from a typed ``ModelConfig``: the policy, its tokenizer, and its special token ids.

The tiny model builder (``rl_engine.models.tiny``) writes a standard model directory; everything here
treats it exactly like any other HF model directory.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_engine.config import ModelConfig

log = logging.getLogger(__name__)

# Class names a plain `tokenizers`-backed tokenizer is saved under (transformers 4.x / 5.x).
_PLAIN_TOKENIZER_CLASSES = {"PreTrainedTokenizerFast", "TokenizersBackend"}
_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
# Config keys of the randomness a model applies in training mode only: dropout probabilities
# (``attention_dropout``, ``hidden_dropout_prob``, GPT-2's ``resid_pdrop``, OPT's ``layerdrop``) and
# the MoE router's jitter noise.
_TRAINING_NOISE_KEY = re.compile(r"dropout|pdrop|layerdrop|jitter_noise")


@dataclass(frozen=True)
class SpecialTokens:
    """Ids that end a response (``eos_ids``, possibly several) and the id used for padding."""

    eos_ids: list[int]
    pad_id: int


def ensure_model(model_cfg: ModelConfig) -> Path:
    """Return the model directory, building the tiny model there first if ``model.tiny`` is set and the
    directory is missing. A missing directory without ``tiny`` is an error that says what to do."""
    path = Path(model_cfg.path)
    if (path / "config.json").exists():
        return path
    if model_cfg.tiny is None:
        from rl_engine.catalogue import CATALOGUE

        if path.name in CATALOGUE:
            raise FileNotFoundError(
                f"model.path {model_cfg.path!r} has no config.json: fetch the model first "
                f"(python -m rl_engine models fetch {path.name} --root {path.parent})"
            )
        raise FileNotFoundError(
            f"model.path {model_cfg.path!r} has no config.json; point it at a model directory "
            "or set model.tiny to build a tiny model there"
        )
    from rl_engine.models.tiny import save_tiny_model

    log.info("building tiny model at %s", path)
    return save_tiny_model(model_cfg.tiny, path)


def _tokenizer_class_of(path: Path) -> str | None:
    try:
        return json.loads((path / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        return None


def load_tokenizer(model_cfg: ModelConfig):  # -> transformers.PreTrainedTokenizerBase
    """The tokenizer, left-padded (generation appends on the right), with a pad token guaranteed."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(model_cfg.tokenizer_path or model_cfg.path)
    if _tokenizer_class_of(path) in _PLAIN_TOKENIZER_CLASSES:
        # A plain fast tokenizer (e.g. the tiny char-level one). transformers forces its own class for
        # some model types (qwen2), which would silently replace a custom vocabulary: load it directly.
        tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    else:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=model_cfg.trust_remote_code)
    tok.padding_side = "left"
    if tok.pad_token_id is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def load_processor(model_cfg: ModelConfig) -> Any | None:
    """A multimodal processor if the model directory has one, else None (text models have none)."""
    try:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(
            model_cfg.tokenizer_path or model_cfg.path, trust_remote_code=model_cfg.trust_remote_code
        )
    except Exception as exc:  # any failure means "no processor": callers fall back to the tokenizer
        log.debug("no processor for %s: %s", model_cfg.path, exc)
        return None


def _generation_config_dict(model_cfg: ModelConfig) -> dict[str, Any]:
    """generation_config.json of the model (empty if absent), overlaid with ``model.generation_config``."""
    out: dict[str, Any] = {}
    gen_path = Path(model_cfg.path) / "generation_config.json"
    if gen_path.exists():
        try:
            out.update(json.loads(gen_path.read_text()))
        except ValueError as exc:
            raise ValueError(f"{gen_path} is not valid JSON: {exc}") from None
    out.update(model_cfg.generation_config or {})
    return out


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def special_token_ids(model_cfg: ModelConfig, tokenizer: Any) -> SpecialTokens:
    """eos/pad ids: the generation config first (it often lists several eos ids), else the tokenizer.

    Never consults a processor (a processor may be None for text models).
    """
    gen = _generation_config_dict(model_cfg)
    eos = _as_id_list(gen.get("eos_token_id")) or _as_id_list(getattr(tokenizer, "eos_token_id", None))
    if not eos:
        raise ValueError(
            f"no eos token for {model_cfg.path}: set model.generation_config.eos_token_id "
            "or give the tokenizer an eos_token"
        )
    pad = gen.get("pad_token_id")
    if pad is None:
        pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = eos[0]
    return SpecialTokens(eos_ids=eos, pad_id=int(pad))


def torch_dtype(model_cfg: ModelConfig):
    import torch

    return getattr(torch, _DTYPES[model_cfg.dtype])


def resolve_device(setting: str, gpus: int, what: str = "trainer") -> str:
    """``auto`` | ``cpu`` | ``cuda`` -> the torch device an actor uses.

    ``auto`` is ``cuda`` exactly when the actor was given a GPU (``gpus`` = the ``resources.*_gpus`` it
    was scheduled with; Ray does not hide the node's GPUs from an actor given none, so "CUDA is
    visible" would be the wrong test). A ``cuda`` result in a process that sees no CUDA device is an
    error that says which setting asked for it.
    """
    device = ("cuda" if gpus > 0 else "cpu") if setting == "auto" else setting
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{what}.device resolves to cuda ({what}.device={setting}, {gpus} GPU(s) reserved) "
                "but this process sees no CUDA device"
            )
    return device


def disable_dropout(config: Any) -> list[str]:
    """Set every training-mode noise setting of an HF ``config`` (and of its sub-configs, e.g. a
    multimodal model's ``text_config``) to 0: dropout probabilities and router jitter. Returns the
    dotted names of the keys it changed (those that were non-zero)."""
    changed: list[str] = []

    def walk(cfg: Any, prefix: str, seen: set[int]) -> None:
        if id(cfg) in seen:
            return
        seen.add(id(cfg))
        for key, value in list(vars(cfg).items()):
            if hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a sub-config
                walk(value, f"{prefix}{key}.", seen)
            elif (
                _TRAINING_NOISE_KEY.search(key)
                and isinstance(value, int | float)
                and not isinstance(value, bool)
                and value != 0
            ):
                setattr(cfg, key, 0.0)
                changed.append(prefix + key)

    walk(config, "", set())
    return changed


def zero_dropout_modules(model: Any) -> int:
    """``p = 0`` on every dropout module of ``model`` (what TRL's ``disable_dropout_in_model`` does);
    returns how many had a non-zero ``p``."""
    import torch

    kinds = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d)
    kinds += (torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout)
    count = 0
    for module in model.modules():
        if isinstance(module, kinds) and module.p:
            module.p, count = 0.0, count + 1
    return count


def load_model(
    model_cfg: ModelConfig, *, device: str = "cpu", dtype: Any = None, training: bool = False
):  # -> transformers.PreTrainedModel
    """``AutoModelForCausalLM.from_pretrained`` with ``override_config`` merged and dropout disabled.

    ``dtype`` overrides ``model.dtype`` (the trainer keeps float32 master weights whatever the rollout
    serves). ``training``: the trainer's copy, where ``model.gradient_checkpointing`` applies.

    Dropout is off in every model the engine trains or scores, as in TRL and OpenRLHF: the trainer runs
    its model in training mode (gradient checkpointing needs it), where dropout would make the
    recomputed old / proximal log-probs random (importance ratios != 1 on on-policy data). The
    config's dropout probabilities (``disable_dropout``) are 0 before the model is built (models that
    read them at each forward included) and every dropout module's ``p`` is 0 after; so a checkpoint's
    and an export's config.json say 0 too: the model was trained without dropout.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-load progress bars would flood worker logs
    path = ensure_model(model_cfg)
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=model_cfg.trust_remote_code)
    for key, value in model_cfg.override_config.items():
        setattr(config, key, value)
    zeroed = disable_dropout(config)
    if zeroed:
        log.info("dropout disabled for RL: %s set to 0", ", ".join(zeroed))
    model = AutoModelForCausalLM.from_pretrained(
        str(path),
        config=config,
        dtype=dtype if dtype is not None else torch_dtype(model_cfg),
        trust_remote_code=model_cfg.trust_remote_code,
        attn_implementation="sdpa",
    )
    zero_dropout_modules(model)  # a module that took its probability from elsewhere than the config
    if training and model_cfg.gradient_checkpointing:
        # Non-reentrant checkpointing of every decoder layer: recomputed in the backward pass.
        # transformers 5.2x renamed the method (the old name warns); older releases only have the old one.
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model.to(device)

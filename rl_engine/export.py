"""Take the model away: a training checkpoint -> a standard Hugging Face model directory.

A LoRA checkpoint (``model.lora``: its ``adapter/`` folder holds the adapters, the base weights are the
run's ``model.path``) exports as the merged model (base + adapters, the same standard directory) with
peft's adapter folder beside it in ``adapter/`` (``adapter_config.json``, ``adapter_model.safetensors``:
``PeftModel.from_pretrained(base, out / "adapter")``).

The result holds only what ``from_pretrained`` needs (weights as safetensors, config.json, the tokenizer
files with its chat template, generation_config.json) plus ``rl_engine_export.json`` saying where it came
from; no optimizer state, RNG or pipeline state. Loaded with ``AutoModelForCausalLM`` it gives the
checkpoint's log-probs (bit-identical in the checkpoint's dtype). A trainer group's sharded checkpoint
(``dcp/``) is gathered into one model here, from its shards, by parameter name. Written into a temporary sibling and
renamed into place, so an interrupted export never leaves a half directory under the final name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SHARDED_DIR = "dcp"  # rl_engine.trainer.checkpoint.SHARDED_DIR (this module loads no torch at import)
ADAPTER_DIR = "adapter"  # rl_engine.models.lora.ADAPTER_DIR: a LoRA checkpoint's adapters, an export's too
_STEP_DIR = re.compile(r"^step_(\d{8})$")
# Files of a save_pretrained directory that are not the tokenizer's: written anew by the export.
_MODEL_FILES = re.compile(r"^(config\.json|generation_config\.json|.*\.safetensors|.*\.bin|.*\.index\.json)$")
DTYPES = ("float32", "bfloat16", "float16")


class ExportError(ValueError):
    """A one-line reason the export cannot be done (bad path, not a checkpoint, output exists)."""


@dataclass(frozen=True)
class ExportResult:
    out: str
    checkpoint: str
    step: int
    dtype: str
    size_bytes: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or the newest ``step_*`` checkpoint inside a run's checkpoint directory."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ExportError(f"{p}: no such directory")
    if (p / "trainer_state.json").exists():
        return p
    steps = sorted((int(m.group(1)), c) for c in p.iterdir() if (m := _STEP_DIR.match(c.name)) and c.is_dir())
    steps = [(s, c) for s, c in steps if (c / "trainer_state.json").exists()]
    if not steps:
        raise ExportError(f"{p} is not a checkpoint (no trainer_state.json) and holds no step_* checkpoint")
    return steps[-1][1]


def _checkpoint_step(ckpt: Path) -> int:
    try:
        return int(json.loads((ckpt / "trainer_state.json").read_text())["version"])
    except (OSError, ValueError, KeyError) as exc:
        raise ExportError(f"{ckpt}/trainer_state.json is unreadable: {exc}") from None


def _lora_model(ckpt: Path, trust_remote_code: bool, tmp: Path):  # -> transformers.PreTrainedModel
    """A LoRA checkpoint's policy: the base model (``base_model_name_or_path`` of its adapter config, the
    run's ``model.path``) with the checkpoint's config, its adapters loaded (from the shards of a trainer
    group's checkpoint), written as peft's adapter folder to ``tmp/adapter``, then merged into the
    weights (float32, as trained)."""
    import torch
    from peft import PeftConfig, PeftModel, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    adapter = ckpt / ADAPTER_DIR
    peft_cfg = PeftConfig.from_pretrained(str(adapter))
    base_path = Path(peft_cfg.base_model_name_or_path or "")
    if not (base_path / "config.json").exists():
        raise ExportError(
            f"{adapter}: the base model {str(base_path)!r} (base_model_name_or_path, the run's model.path) "
            "is not there; a LoRA checkpoint holds the adapters only"
        )
    config = AutoConfig.from_pretrained(str(ckpt / "model"), trust_remote_code=trust_remote_code)
    base = AutoModelForCausalLM.from_pretrained(
        str(base_path), config=config, dtype=torch.float32, trust_remote_code=trust_remote_code
    )
    if (ckpt / SHARDED_DIR).is_dir():
        from rl_engine.trainer.checkpoint import load_sharded

        peft_cfg.inference_mode = False  # trainable adapters: the shards hold the trainable parameters
        model = get_peft_model(base, peft_cfg)
        load_sharded(ckpt / SHARDED_DIR, model, None, trainable_only=True)
    else:
        model = PeftModel.from_pretrained(base, str(adapter))
    model.save_pretrained(str(tmp / ADAPTER_DIR), safe_serialization=True, save_embedding_layers=False)
    return model.merge_and_unload()


def _write(ckpt: Path, tmp: Path, dtype: str | None, trust_remote_code: bool) -> str:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    src = ckpt / "model"
    if (ckpt / ADAPTER_DIR).is_dir():  # LoRA: the base model and the adapters, merged
        model = _lora_model(ckpt, trust_remote_code, tmp)
        if dtype:
            model = model.to(getattr(torch, dtype))
    elif (ckpt / SHARDED_DIR).is_dir():  # a trainer group's checkpoint: the weights are shards, by name
        from transformers import AutoConfig

        from rl_engine.trainer.checkpoint import load_sharded

        config = AutoConfig.from_pretrained(str(src), trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_config(
            config, trust_remote_code=trust_remote_code, dtype=torch.float32
        )
        load_sharded(ckpt / SHARDED_DIR, model, None)
        if dtype:
            model = model.to(getattr(torch, dtype))
    else:
        kwargs = {"dtype": getattr(torch, dtype)} if dtype else {"dtype": "auto"}
        model = AutoModelForCausalLM.from_pretrained(str(src), trust_remote_code=trust_remote_code, **kwargs)
    if not (src / "generation_config.json").exists():
        # eos/pad/bos from the model config: what generate() needs to stop where training stopped
        model.generation_config = GenerationConfig.from_model_config(model.config)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in src.iterdir():  # the tokenizer exactly as trained with (vocabulary, chat template, padding)
        if f.is_file() and not _MODEL_FILES.match(f.name):
            shutil.copy2(f, tmp / f.name)
    return str(next(iter(model.parameters())).dtype).removeprefix("torch.")


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    dtype: str | None = None,
    overwrite: bool = False,
    trust_remote_code: bool = False,
) -> ExportResult:
    """Write the checkpoint's policy to ``out`` as a standard HF model directory; see the module docstring.

    ``dtype``: cast the weights (float32 / bfloat16 / float16); None keeps the checkpoint's.
    """
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(DTYPES)}")
    ckpt = resolve_checkpoint(checkpoint)
    if not (ckpt / "model" / "config.json").exists():
        raise ExportError(f"{ckpt} has no model/config.json: not a complete checkpoint")
    step = _checkpoint_step(ckpt)
    dest = Path(out).expanduser()
    if dest.exists() and not overwrite:
        raise ExportError(f"{dest} already exists; choose a new directory or pass --force")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        saved_dtype = _write(ckpt, tmp, dtype, trust_remote_code)
        info = {"source_checkpoint": str(ckpt.resolve()), "step": step, "dtype": saved_dtype,
                "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        (tmp / "rl_engine_export.json").write_text(json.dumps(info, indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    return ExportResult(out=str(dest), checkpoint=str(ckpt), step=step, dtype=saved_dtype, size_bytes=size)


__all__ = ["DTYPES", "ExportError", "ExportResult", "export_checkpoint", "resolve_checkpoint"]

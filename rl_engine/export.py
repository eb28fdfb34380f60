"""Take the model away: a training checkpoint -> a standard Hugging Face model directory.

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


def _write(ckpt: Path, tmp: Path, dtype: str | None, trust_remote_code: bool) -> str:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    src = ckpt / "model"
    if (ckpt / SHARDED_DIR).is_dir():  # a trainer group's checkpoint: the weights are shards, by name
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

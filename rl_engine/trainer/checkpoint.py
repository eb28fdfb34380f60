"""Checkpoint directory layout and atomic writes.

A checkpoint is a directory::

    model/                 save_pretrained output (config.json, *.safetensors, tokenizer files):
                           loadable on its own with AutoModelForCausalLM.from_pretrained
    optimizer.pt           AdamW state_dict
    scheduler.pt           LR scheduler state_dict
    rng.pt                 torch / numpy / python RNG states and the trainer's shuffle generator
    trainer_state.json     version, optimizer steps, format version
    proximal.safetensors   (decoupled off-policy only) the proximal policy's weights
    extra.pt               the caller's dict (data position, queued / in-flight samples, ...)

It is written into a temporary sibling directory and renamed into place, so a crash mid-write never
leaves a half checkpoint under the final name.
"""

from __future__ import annotations

import os
import random
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 1


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_dir)`` then move ``tmp_dir`` to ``path`` (replacing an existing checkpoint)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write(tmp)
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(path, old)
        os.rename(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "shuffle": generator.get_state(),
    }


def set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    generator.set_state(state["shuffle"])


def load_safetensors_dir(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of every ``*.safetensors`` file in a directory (sharded checkpoints included)."""
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {directory}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


@torch.no_grad()
def copy_named_params(model: torch.nn.Module, tensors: dict[str, torch.Tensor], what: str) -> None:
    """Copy tensors into the model's parameters by name; every parameter must be present."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(tensors))
    if missing:
        raise ValueError(f"{what}: missing parameters {missing[:5]}")
    for name, p in params.items():
        p.copy_(tensors[name].to(dtype=p.dtype, device=p.device))

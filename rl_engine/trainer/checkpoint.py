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

A trainer group (more than one rank) writes a *sharded* checkpoint instead of ``model/*.safetensors``
and ``optimizer.pt``: ``dcp/`` holds the model and AdamW state written by every rank with
``torch.distributed.checkpoint`` (each rank its shards, keyed by parameter name), and ``model/`` only the
config and tokenizer files. ``torch.distributed.checkpoint`` reshards on load, so a sharded checkpoint
resumes on any number of ranks (one included), and ``rl_engine export`` turns it into a model directory.
``trainer_state.json`` records ``world_size``. The group's directory must be on storage every rank can
reach (one machine, or a shared filesystem across nodes).

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
SHARDED_DIR = "dcp"


def _move_into_place(tmp: Path, path: Path) -> None:
    """Rename the written ``tmp`` to ``path``; an existing checkpoint there is moved aside first and
    removed only once the new one is in place."""
    old = None
    if path.exists():
        old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(path, old)
    os.rename(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_dir)`` then move ``tmp_dir`` to ``path`` (replacing an existing checkpoint)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write(tmp)
        _move_into_place(tmp, path)
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


def is_sharded(path: Path) -> bool:
    return (Path(path) / SHARDED_DIR).is_dir()


def write_atomically_group(path: Path, write: Callable[[Path], None], rank: int, world: int) -> None:
    """``write_atomically`` for a trainer group: every rank calls ``write`` on the same temporary
    directory (named by rank 0), rank 0 renames it once all have written."""
    if world == 1:
        write_atomically(path, write)
        return
    import torch.distributed as dist

    path = Path(path)
    name = [f".{path.name}.tmp-{uuid.uuid4().hex[:8]}" if rank == 0 else None]
    dist.broadcast_object_list(name, src=0)
    tmp = path.parent / str(name[0])
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    dist.barrier()
    try:
        write(tmp)
        dist.barrier()  # every rank's shards are on disk
        if rank == 0:
            _move_into_place(tmp, path)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()  # no rank returns before the checkpoint is in place


def _options(trainable_only: bool):  # -> StateDictOptions
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # trainable_only (LoRA): the frozen weights are the model's files, not the checkpoint's
    return StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)


def _model_entries(state: dict[str, Any], model: torch.nn.Module, trainable_only: bool) -> dict[str, Any]:
    """``state`` (a model state dict by parameter name), with ``trainable_only`` the trainable
    parameters' entries alone: ``ignore_frozen_params`` still keeps a frozen weight tied to another
    under its second name (a tied output layer: the whole embedding)."""
    if not trainable_only:
        return state
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in state.items() if k in trainable}


def save_sharded(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, trainable_only: bool = False
) -> None:
    """Every rank writes its shards of the model and AdamW state (by parameter name) to ``directory``;
    ``trainable_only``: the parameters that train (LoRA adapters), not the frozen ones."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(trainable_only))
    model_sd = _model_entries(model_sd, model, trainable_only)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(directory))


def load_sharded(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    trainable_only: bool = False,
) -> None:
    """Read a sharded checkpoint into ``model`` (and ``optimizer``), resharded to this process group (or
    whole, with no process group); ``trainable_only``: one written so (the frozen weights stay as loaded)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    options = _options(trainable_only)
    if optimizer is None:
        state = {"model": _model_entries(get_model_state_dict(model, options=options), model, trainable_only)}
        dcp.load(state, checkpoint_id=str(directory))
        set_model_state_dict(model, state["model"], options=options)
        return
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    state = {"model": _model_entries(model_sd, model, trainable_only), "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options
    )

"""The models a config on this platform may name (``GET /api/models``, ``rlp models``, the form's picker).

Every model directory under ``MODEL_ROOTS`` (a root's children, and ``org/name`` grandchildren; never
what runs build for their projects), then each entry of ``ALLOWED_MODELS`` that is a model directory on
this machine. What each holds is read from its files by ``rl_engine.catalogue`` (no torch): parameters,
vocabulary, head size, chat template, the rollout backends that can serve it, its card. The engine's
catalogue models not fetched yet are listed apart, with the command that fetches them.

A model's files are read only as regular files inside its root (an ``ALLOWED_MODELS`` folder: inside
itself), bounded; a file refused or not parsed is named in the model's ``unreadable`` and says nothing
(``rl_engine.safe_files``). The answer gives a model's absolute path (the value ``model.path`` takes,
what the form's picker offers) only to a member of some project; anyone else sees where it lies under
its root (``models/org/name``: the root's folder name, then the model's folder under it), or the folder's
name for an ``ALLOWED_MODELS`` entry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.conf import settings

from rl_engine.catalogue import CATALOGUE, ModelInfo, describe, is_model_dir, list_models


@dataclass(frozen=True)
class Unfetched:
    name: str
    title: str
    licence: str
    command: str


def available_models() -> list[ModelInfo]:
    """The model directories a config may name here, each once, roots first; an entry of
    ``ALLOWED_MODELS`` by its text as given (the policy allows it verbatim: ``/m/x/`` is not ``/m/x``)."""
    infos = list_models(settings.MODEL_ROOTS)
    seen = {Path(info.path).resolve() for info in infos}
    for value in sorted(settings.ALLOWED_MODELS):
        folder = Path(value)
        if folder.is_absolute() and is_model_dir(folder) and folder.resolve() not in seen:
            seen.add(folder.resolve())
            infos.append(replace(describe(folder), path=value))
    return infos


def unfetched(infos: list[ModelInfo]) -> list[Unfetched]:
    """The engine's catalogue models that no root holds yet (by folder name)."""
    present = {info.name for info in infos}
    return [
        Unfetched(e.name, e.title, e.licence, f"python -m rl_engine models fetch {e.name}")
        for e in CATALOGUE.values()
        if e.name not in present
    ]


def shown_path(info: ModelInfo) -> str:
    """The model's place without this server's absolute paths: ``<root folder>/<folder under it>``
    under a model root, else (an ``ALLOWED_MODELS`` entry) the folder's name."""
    path = Path(info.path)
    for root in settings.MODEL_ROOTS:
        if path.is_relative_to(root):
            return (Path(Path(root).name) / path.relative_to(root)).as_posix()
    return info.name


def catalogue_document(*, full_paths: bool = False) -> dict[str, Any]:
    """``GET /api/models``: absolute paths only with ``full_paths`` (the requester is a member of some
    project, who may name them in a config), else :func:`shown_path`."""
    infos = available_models()
    if not full_paths:
        infos = [replace(info, path=shown_path(info)) for info in infos]
    return {
        "models": [info.as_dict() for info in infos],
        "not_fetched": [u.__dict__ for u in unfetched(infos)],
    }

"""The models a config on this platform may name (``GET /api/models``, ``rlp models``, the form's picker).

Every model directory under ``MODEL_ROOTS`` (a root's children, and ``org/name`` grandchildren; never
what runs build for their projects), then each entry of ``ALLOWED_MODELS`` that is a model directory on
this machine. What each holds is read from its files by ``rl_engine.catalogue`` (no torch): parameters,
vocabulary, head size, chat template, the rollout backends that can serve it, its card. The engine's
catalogue models not fetched yet are listed apart, with the command that fetches them.
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


def catalogue_document() -> dict[str, Any]:
    infos = available_models()
    return {
        "models": [info.as_dict() for info in infos],
        "not_fetched": [u.__dict__ for u in unfetched(infos)],
    }

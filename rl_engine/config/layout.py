"""Where a pydantic model's nested models and discriminated unions sit, read from the models themselves
(no list of tags or sections kept by hand): what turns pydantic's error locations into field paths and
what tells a fork which fields a section of another kind keeps."""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass

from pydantic import BaseModel

from rl_engine.config.errors import joined


@dataclass(frozen=True)
class TaggedUnion:
    """A field that is one of several models told apart by a tag field (``rollout.backend``)."""

    tag: str
    variants: dict[str, type[BaseModel]]  # tag value -> its model

    def fields_of(self, kind: str) -> set[str]:
        return set(self.variants[kind].model_fields)


@dataclass(frozen=True)
class Layout:
    unions: dict[str, TaggedUnion]  # dotted path -> the union there
    sites: dict[type[BaseModel], tuple[str, ...]]  # a model -> the dotted paths it is found at ("": the root)


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The models a field holds directly: ``M`` or ``M | None`` (not inside a list or a dict, whose
    items have locations of their own)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        candidates = [a for a in args if a is not type(None)]
    else:
        candidates = [annotation]
    return [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]


@functools.cache
def layout(model: type[BaseModel]) -> Layout:
    unions: dict[str, TaggedUnion] = {}
    sites: dict[type[BaseModel], list[str]] = {}

    def walk(cls: type[BaseModel], where: str) -> None:
        sites.setdefault(cls, []).append(where)
        for name, info in cls.model_fields.items():
            path = joined(where, name)
            members = _models_in(info.annotation)
            if isinstance(info.discriminator, str):
                tag = info.discriminator
                unions[path] = TaggedUnion(tag, {m.model_fields[tag].default: m for m in members})
            for member in members:
                walk(member, path)

    walk(model, "")
    return Layout(unions, {cls: tuple(paths) for cls, paths in sites.items()})

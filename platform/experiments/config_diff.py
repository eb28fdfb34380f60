"""How configs differ: every leaf field whose value is not the same in all of them, as a dotted path.

Pure functions on plain JSON documents (no Django, no engine): the compare view's "Config differences"
and ``GET /api/runs/compare`` build on :func:`config_differences`.

- A *leaf* is any value that is not a mapping: a scalar, ``null`` or a list (a list is one value: a
  changed list is one difference at its path). An empty mapping is a leaf too (``{}``), so that it is
  never lost.
- A field one document lacks is :data:`ABSENT` there, which is not ``None`` (a field written as ``null``).
  Where one document has a mapping and another a leaf at the same path, the leaf's path differs (absent
  in the first) and so does every leaf under the mapping (absent in the second).
- Values are compared as JSON values: ``true`` is not ``1``, ``1`` equals ``1.0``, lists element by
  element, mappings key by key.
- Paths join keys with dots; a key that is not a plain name (a dot, a space, empty) is written as a
  JSON-quoted index, ``data.columns["a.b"]``, so that two different fields never share a path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


class _Absent:
    """The value of a field a document does not have (a singleton; JSON has no word for it)."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()


@dataclass(frozen=True)
class Difference(Generic[K]):
    """One leaf field whose value is not the same everywhere: ``values`` has every document's key, in the
    order the documents were given, with :data:`ABSENT` where the document lacks the field."""

    keys: tuple[str, ...]
    values: dict[K, Any]

    @property
    def path(self) -> str:
        return dotted_path(self.keys)

    @property
    def absent(self) -> list[K]:
        return [k for k, v in self.values.items() if v is ABSENT]

    def present(self) -> dict[K, Any]:
        """The values of the documents that have the field."""
        return {k: v for k, v in self.values.items() if v is not ABSENT}


def dotted_path(keys: tuple[str, ...]) -> str:
    out = ""
    for key in keys:
        if _PLAIN_KEY.fullmatch(key):
            out = f"{out}.{key}" if out else key
        else:
            out += f"[{json.dumps(key, ensure_ascii=False)}]"
    return out


def same_value(a: Any, b: Any) -> bool:
    """JSON equality: a boolean equals only a boolean, numbers by value, containers item by item."""
    if a is ABSENT or b is ABSENT:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is not type(b):
        return False
    return bool(a == b)


def _is_branch(value: Any) -> bool:
    """A mapping with fields to descend into (an empty mapping is a leaf)."""
    return isinstance(value, Mapping) and len(value) > 0


def config_differences(configs: Mapping[K, Mapping[str, Any]]) -> list[Difference[K]]:
    """The leaf fields whose value is not the same in every one of ``configs`` ({key: document}), sorted by
    path (key by key). One document, or none, has no differences."""
    out: list[Difference[K]] = []
    if len(configs) > 1:
        _walk((), {k: dict(doc) for k, doc in configs.items()}, out)
    out.sort(key=lambda d: d.keys)
    return out


def _walk(prefix: tuple[str, ...], nodes: dict[K, Any], out: list[Difference[K]]) -> None:
    """Descend into the documents together: ``nodes`` holds each document's value at ``prefix``."""
    # The documents themselves are always descended into (an empty one simply has no fields).
    branches = {k: v for k, v in nodes.items() if _is_branch(v) or (not prefix and isinstance(v, Mapping))}
    leaves = {k: v for k, v in nodes.items() if v is not ABSENT and k not in branches}
    if leaves:
        # A leaf here: its value against every other document's (absent where they branch or lack it).
        here = {k: (v if k in leaves else ABSENT) for k, v in nodes.items()}
        first, *rest = here.values()
        if not all(same_value(first, v) for v in rest):
            out.append(Difference(keys=prefix, values=here))
    if branches:
        names: dict[str, None] = {}
        for value in branches.values():
            names.update(dict.fromkeys(value))
        for name in names:
            children = {k: (branches[k].get(name, ABSENT) if k in branches else ABSENT) for k in nodes}
            _walk((*prefix, name), children, out)

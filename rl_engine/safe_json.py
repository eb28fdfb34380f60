"""The one check of the free-form JSON the platform stores (docs/api.md, "Trust boundary").

Event data and sample fields of the ingestion wire (``rl_engine.wire``), experiment configs and tags:
whatever a client sends as JSON or as YAML is parsed into Python values that must then be storable in
PostgreSQL's ``jsonb``/``text`` (which refuse NUL, lone UTF-16 surrogates, ``Infinity`` and ``NaN``)
and renderable as strict JSON. The platform's request parsers (``accounts.parsers`` for JSON bodies,
``experiments.yaml_io`` for YAML) pass what they parsed through :func:`json_problem`, so a value that
could not be stored or listed is a 400 naming its field instead of a 500 on insert, or later, on every
read. Pure standard library: the platform imports it (no torch, ray or Django).

:func:`json_repaired` is the other direction, for values that got in before this check (a data
migration, and the API's renderer as a last resort): it replaces what the check refuses.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

MAX_JSON_DEPTH = 64  # a config is ~4 levels deep; deeper bodies would only feed recursive code
MAX_JSON_NODES = 2_000_000  # values in one document (the body size limits bound it first in practice)
REPLACEMENT = "\ufffd"
_SURROGATES = re.compile("[\ud800-\udfff]")

NUL = "must not contain the NUL character (\\u0000)"
SURROGATE = "must be valid Unicode (a lone UTF-16 surrogate such as \\ud800 is not)"
NOT_FINITE = "must be a finite number (not NaN, Infinity or a number beyond the float range)"
NOT_JSON = "must be a string, number, boolean, null, list or mapping"


def _str_problem(text: str) -> str | None:
    if "\x00" in text:
        return NUL
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return SURROGATE
    return None


def _leaf_problem(value: object) -> str | None:
    kind = type(value)
    if kind is str:
        return _str_problem(value)  # type: ignore[arg-type]
    if kind is float:
        return None if math.isfinite(value) else NOT_FINITE  # type: ignore[arg-type]
    if kind is int or kind is bool or value is None:
        return None
    return NOT_JSON


def json_problem(value: object, *, max_depth: int = MAX_JSON_DEPTH) -> tuple[str, str] | None:
    """``(field.path, problem)`` of the first value a store or strict JSON cannot hold, or None.

    One pass, level by level (no recursion), with exact type checks: ~2 ms on a 5000-point batch. Only
    when something is wrong is the document walked again to name the field.
    """
    level, depth, nodes = [value], 0, 0
    while level:
        depth += 1
        nodes += len(level)
        if nodes > MAX_JSON_NODES:
            return "", f"holds more than {MAX_JSON_NODES} values"
        below: list[object] = []
        extend = below.extend
        for item in level:
            kind = type(item)
            if kind is dict or kind is list:
                if depth > max_depth:
                    return "", f"is nested deeper than {max_depth} levels"
                extend(item)  # type: ignore[arg-type]  # a dict's keys: str, checked below
                if kind is dict:
                    extend(item.values())  # type: ignore[union-attr]
            elif kind is str:
                if ("\x00" in item or not item.isascii()) and _str_problem(item):  # type: ignore[operator,union-attr,arg-type]
                    return _locate(value)
            elif kind is float:
                if item - item != 0.0:  # type: ignore[operator]  # inf - inf and nan - nan are nan
                    return _locate(value)
            elif not (kind is int or kind is bool or item is None):
                return _locate(value)
        level = below
    return None


def _walk(value: object, path: str) -> Iterator[tuple[str, object]]:
    stack: list[tuple[str, object]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        yield where, item
        if type(item) is dict:
            children = []
            for key, child in item.items():  # type: ignore[union-attr]
                shown = _text_repaired(str(key))  # the path goes into the error: it must render
                name = f"{where}.{shown}" if where else shown
                yield name, _Key(key)
                children.append((name, child))
            stack.extend(reversed(children))
        elif type(item) is list:
            stack.extend(reversed([(f"{where}[{i}]", child) for i, child in enumerate(item)]))  # type: ignore[arg-type]


class _Key:
    """A mapping key seen by :func:`_walk` (checked as text, never descended into)."""

    __slots__ = ("key",)

    def __init__(self, key: object):
        self.key = key


def _locate(value: object) -> tuple[str, str]:
    for path, item in _walk(value, ""):
        if type(item) is _Key:
            problem = _leaf_problem(item.key)  # type: ignore[union-attr]
            if problem:
                return path, f"(a key) {problem}"
        elif type(item) not in (dict, list):
            problem = _leaf_problem(item)
            if problem:
                return path, problem
    return "", "is not valid JSON"


def json_repaired(value: Any) -> Any:
    """A copy of ``value`` that :func:`json_problem` accepts (depth aside): NUL removed, lone
    surrogates replaced by U+FFFD, non-finite numbers replaced by null. Other types are left as they are
    (a renderer's encoder knows its dates)."""
    if isinstance(value, Mapping):
        return {_text_repaired(k) if isinstance(k, str) else k: json_repaired(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_repaired(v) for v in value]
    if isinstance(value, str):
        return _text_repaired(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value


def _text_repaired(text: str) -> str:
    if _str_problem(text) is None:
        return text
    return _SURROGATES.sub(REPLACEMENT, text.replace("\x00", ""))

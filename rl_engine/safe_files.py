"""Reading a file the platform did not write: a model folder's ``config.json``, safetensors header,
tokenizer files and card (``rl_engine.catalogue``), a dataset folder's card and ``save_to_disk`` manifest
(``rl_engine.dataset_folder``). Whoever can put files into a model or data root chooses what they are:

- a link: only a file whose real path (links followed) lies inside the given roots is read;
- a FIFO, a device, a folder: only a regular file is opened (``O_NONBLOCK``, then ``fstat``), never one
  that blocks the request that reads it;
- huge: at most ``limit`` bytes are read;
- a parser bomb: JSON or YAML nested deeper than :data:`MAX_DEPTH`, YAML with aliases (``*a``, which can
  make a few hundred bytes stand for gigabytes), more than :data:`MAX_YAML_NODES` YAML nodes: refused,
  never a ``RecursionError``.

Each refusal is a :class:`UnsafeFile` (a ``ValueError``) of one line that names no path (the caller
says which file); an absent file stays ``FileNotFoundError``. Standard library and PyYAML only: the
platform imports this module (through ``rl_engine.catalogue`` and ``rl_engine.dataset_folder``).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import yaml

from rl_engine.safe_json import MAX_JSON_DEPTH, json_problem

MAX_DEPTH = MAX_JSON_DEPTH  # a config or a card is a few levels deep
MAX_YAML_NODES = 200_000  # nodes of one YAML document (a 1 MiB card holds fewer)
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class UnsafeFile(ValueError):
    """A file refused (or that does not parse) for a reason of one line naming no path."""


class OutsideRoots(UnsafeFile):
    """The file's real path (links followed) lies in none of the roots."""


def _inside(real: str, roots: Iterable[str | Path]) -> bool:
    return any(Path(real).is_relative_to(os.path.realpath(root)) for root in roots)


def _check(real: str, roots: Iterable[str | Path] | None) -> None:
    if roots is not None and not _inside(real, roots):
        raise OutsideRoots("a link whose real path lies outside the root")


def regular_file(path: str | Path, roots: Iterable[str | Path] | None = None) -> str:
    """The real path of ``path``, a regular file inside ``roots`` (None: anywhere), without opening it.
    FileNotFoundError where there is none; UnsafeFile for anything else there."""
    real = os.path.realpath(path)
    roots = None if roots is None else list(roots)
    _check(real, roots)
    mode = os.lstat(real).st_mode  # FileNotFoundError: absent (or a dangling link)
    if not stat.S_ISREG(mode):
        raise UnsafeFile("not a regular file")
    return real


def open_regular(path: str | Path, roots: Iterable[str | Path] | None = None) -> IO[bytes]:
    """``path`` opened for reading in binary, refused unless it is a regular file whose real path lies
    inside ``roots`` (None: anywhere). Never blocks on a FIFO; follows no link after the check."""
    roots = None if roots is None else list(roots)
    real = regular_file(path, roots)
    try:
        fd = os.open(real, _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: the last component became a link since the check
        raise UnsafeFile(exc.strerror or type(exc).__name__) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeFile("not a regular file")
        opened = f"/proc/self/fd/{fd}"  # where the open really landed (a folder above may have moved)
        if roots is not None and os.path.islink(opened):
            _check(os.readlink(opened), roots)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(
    path: str | Path, *, limit: int, roots: Iterable[str | Path] | None = None
) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of the regular file ``path`` (see :func:`open_regular`), and whether
    there was more."""
    with open_regular(path, roots) as fh:
        raw = fh.read(limit + 1)
    return raw[:limit], len(raw) > limit


def depth_problem(value: Any, max_depth: int = MAX_DEPTH) -> str | None:
    """Whether ``value`` (parsed JSON or YAML) nests deeper than ``max_depth``; level by level."""
    level, depth = [value], 0
    while level:
        below: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                below.extend(item.values())
            elif isinstance(item, list | tuple):
                below.extend(item)
        if below and depth >= max_depth:
            return f"nested deeper than {max_depth} levels"
        depth += 1
        level = [item for item in below if isinstance(item, dict | list | tuple)]
    return None


def json_safe_problem(value: Any) -> str | None:
    """What keeps ``value`` from being served as strict JSON: a key that is not a string, a value that
    is no JSON value (a date, bytes, a set, NaN), depth; None when it can be."""
    level = [value]
    while level:
        below: list[Any] = []
        for item in level:
            if type(item) is dict:
                if not all(type(k) is str for k in item):
                    return "a key that is not a string"
                below.extend(item.values())
            elif type(item) is list:
                below.extend(item)
        level = below
    found = json_problem(value, max_depth=MAX_DEPTH)
    if found is None:
        return None
    where, problem = found
    return f"{where} {problem}".strip() if where else problem


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(data: bytes | str, *, strict: bool = False) -> Any:
    """JSON text parsed, refused (UnsafeFile) when it does not parse or nests deeper than
    :data:`MAX_DEPTH`; ``strict``: also unless it is servable as strict JSON (no NaN or Infinity)."""
    try:
        value = json.loads(data, parse_constant=_no_constant) if strict else json.loads(data)
    except RecursionError:
        raise UnsafeFile(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # UnicodeDecodeError too
        raise UnsafeFile(
            f"not JSON ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        ) from None
    problem = json_safe_problem(value) if strict else depth_problem(value)
    if problem:
        raise UnsafeFile(problem)
    return value


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases, with bounded depth and node count, and dates kept as the
    text written (a card's ``2024-01-01`` is a string, as JSON would have it)."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise UnsafeFile(f"its YAML uses an alias (*{event.anchor}), which is not accepted here")
        self._nodes += 1
        if self._nodes > MAX_YAML_NODES:
            raise UnsafeFile(f"its YAML holds more than {MAX_YAML_NODES} values")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise UnsafeFile(f"its YAML is nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str, *, strict: bool = False) -> Any:
    """One YAML document parsed with :class:`_Loader` (UnsafeFile when refused or when it does not
    parse); ``strict``: also unless it is servable as strict JSON (string keys, JSON values only)."""
    loader = _Loader(text)
    try:
        value = loader.get_single_data()
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnsafeFile(f"its YAML does not parse ({first})") from None
    except RecursionError:
        raise UnsafeFile(f"its YAML is nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()
    if strict and (problem := json_safe_problem(value)):
        raise UnsafeFile(f"its YAML holds {problem}" if problem.startswith("a ") else f"its YAML: {problem}")
    return value

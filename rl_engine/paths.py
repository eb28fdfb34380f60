"""What a local data path reads, by real path: the file, every match of a glob, every file under a folder.

A path that names a root-relative place is only half the check: a symlink inside a data root that
points elsewhere is read through a glob (``/data/*.csv``) or a folder (``/data/set/``) as well as when
named. The platform (its config policy) and the engine (before reading) both expand the path here and
refuse any entry whose real path (symlinks followed) leaves the allowed roots. Standard library only:
the platform imports this module.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

MAGIC = "*?["
MAX_ENTRIES = 200_000  # a walk this long is refused instead of holding a request (or a job) for minutes
ROOTS_ENV = "RL_ENGINE_DATA_ROOTS"  # os.pathsep-separated roots the platform's jobs may read data from


class TooManyEntries(ValueError):
    """The path expands to more than MAX_ENTRIES entries."""


def is_glob(path: str) -> bool:
    return any(ch in path for ch in MAGIC)


def _walk(top: str, seen: set[str], keep: Callable[[str], bool]) -> Iterator[str]:
    """Every entry under folder ``top``; folders (and links to folders) are entered once each, and only
    when ``keep`` accepts them."""
    real = os.path.realpath(top)
    if real in seen:
        return
    seen.add(real)
    try:
        names = sorted(os.listdir(top))
    except OSError:
        return
    for name in names:
        entry = os.path.join(top, name)
        yield entry
        if os.path.isdir(entry) and keep(entry):
            yield from _walk(entry, seen, keep)


def entries(path: str | Path, keep: Callable[[str], bool] = lambda _: True) -> Iterator[str]:
    """What reading ``path`` may open: the path itself, the matches of a glob (``**`` recursive, hidden
    names included), and everything under a folder among them (entered only where ``keep`` accepts the
    folder). Raises TooManyEntries past MAX_ENTRIES."""
    text = os.path.expanduser(str(path))
    # iglob: lazily, so that the bound below also stops a glob that runs round a symlink loop
    tops = glob.iglob(text, recursive=True, include_hidden=True) if is_glob(text) else iter([text])
    seen: set[str] = set()
    count = 0
    for top in tops:
        walk = _walk(top, seen, keep) if os.path.isdir(top) and keep(top) else iter(())
        for entry in _chain(top, walk):
            count += 1
            if count > MAX_ENTRIES:
                raise TooManyEntries(f"{path} holds more than {MAX_ENTRIES} files and folders")
            yield entry


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


def real_inside(entry: str, roots: Iterable[str | Path]) -> bool:
    real = Path(os.path.realpath(entry))
    return any(real.is_relative_to(os.path.realpath(root)) for root in roots)


def escaping(path: str | Path, roots: Iterable[str | Path], limit: int = 5) -> list[str]:
    """Up to ``limit`` entries of ``path`` (see :func:`entries`) whose real path lies in none of
    ``roots`` (a folder that leaves them is reported, not entered)."""
    roots = list(roots)

    def inside(entry: str) -> bool:
        return real_inside(entry, roots)

    out: list[str] = []
    for entry in entries(path, keep=inside):
        if not inside(entry):
            out.append(entry)
            if len(out) >= limit:
                break
    return out


def roots_from_env(environ: dict[str, str] | None = None) -> list[str]:
    """The data roots a platform job was given (empty for the CLI, which trusts its user)."""
    raw = (os.environ if environ is None else environ).get(ROOTS_ENV, "")
    return [p for p in raw.split(os.pathsep) if p]

"""What a local dataset folder makes ``datasets`` read, worked out by the engine itself.

``datasets.load_dataset(folder)`` follows the folder's card (``README.md``'s YAML front matter, and a
``.huggingface.yaml`` beside it): a config's ``data_files`` and ``data_dir`` may name ``../..``, an
absolute path, a glob reaching out, or a URL, none of which is a symlink, so a walk of the folder never
sees them. ``load_from_disk(folder)`` likewise opens the files its manifest (``dataset_dict.json``,
``state.json``) names. The engine therefore never hands a folder to ``datasets``: it resolves the files
here and passes them explicitly (``load_dataset(<builder>, data_files={split: [files]})``), and the
platform's config policy asks the same questions before it accepts a config.

The card, as read here (the subset of ``datasets``' card that a data folder needs):

- ``configs``: a list of ``{config_name, data_files, data_dir, default}``; any other key of a config is
  refused (this resolver does not pass builder options on). ``data.name`` picks a config; without it the
  only config, or the one named ``default`` or marked ``default: true``.
- ``data_files``: a pattern, a list of patterns (split ``train``), or a list of ``{split, path}`` with
  ``path`` a pattern or a list of them. A pattern is a file or a glob (``**`` recursive, hidden names not
  matched by wildcards), relative to the folder's real path (or ``data_dir``), or absolute.
- ``data_dir`` without ``data_files``: the conventional layout under that folder.

Every file a pattern matches must, by real path (symlinks followed), lie inside the data roots when
roots are given (a platform job's ``RL_ENGINE_DATA_ROOTS``, the platform's ``DATA_ROOTS``); the CLI gives
none and trusts its user. A URL (``scheme:...`` or a ``::`` chain) is never followed unless the caller
allows it (the CLI with ``data.allow_download``; a platform job never). Without ``configs`` the folder
has the conventional layout, which reads only files inside it (covered by the walk of
``rl_engine.paths``).

The card (``README.md``, ``.huggingface.yaml``) and the manifests (``dataset_dict.json``,
``state.json``) are themselves read through :mod:`rl_engine.safe_files`: only as regular files (a FIFO
would block the request), whose real path lies inside the data roots when roots are given, at most
CARD_MAX_BYTES, YAML without aliases, neither nested deeper than ``safe_files.MAX_DEPTH``; anything else
is a FolderError. Standard library and PyYAML only: the platform imports this module.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_engine import paths, safe_files

CARD = "README.md"
STANDALONE_YAML = ".huggingface.yaml"
CARD_MAX_BYTES = 1 << 20  # a card's YAML is a few KB; a larger one is refused, not parsed
MAX_PATTERNS = 1000  # patterns of one config
CONFIG_KEYS = frozenset({"config_name", "data_files", "data_dir", "default"})
DEFAULT_SPLIT = "train"
SPLIT_NAME = re.compile(r"^\w+(\.\w+)*$")  # what `datasets` accepts as a split name
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class FolderError(ValueError):
    """The folder's card or manifest cannot be followed here; one line naming the file and the entry."""


@dataclass(frozen=True)
class CardConfig:
    """One config of a card: the patterns per split as written, and the folder they count from."""

    name: str
    data_dir: str | None
    data_files: dict[str, tuple[str, ...]] | None  # split -> patterns; None: the conventional layout
    default: bool = False


@dataclass(frozen=True)
class FolderFiles:
    """What a dataset folder reads for one config: the card's files per split (real paths, or URLs
    the caller allowed), or ``splits`` None for the conventional layout under ``base``."""

    base: str
    splits: dict[str, list[str]] | None


def is_url(pattern: str) -> bool:
    """A pattern ``datasets`` would open through fsspec rather than as a local path: ``http://...``,
    ``hf://...``, ``file:...``, ``zip://a::b``. Anything with a scheme counts, so ``C:x`` does too."""
    return bool(_SCHEME.match(pattern)) or "::" in pattern


def _front_matter(text: str) -> str | None:
    """The YAML block between a first line ``---`` and the next ``---`` line (``datasets``' rule)."""
    lines = text.splitlines()
    if lines and lines[0] == "---" and "---" in lines[1:]:
        end = lines[1:].index("---") + 1
        return "\n".join(lines[1:end])
    return None


def _read_head(path: Path, roots: Sequence[str | Path]) -> tuple[str, bool]:
    """The first CARD_MAX_BYTES of a regular file as text (inside the roots, where given), and whether
    there was more."""
    try:
        raw, cut = safe_files.read_bytes(path, limit=CARD_MAX_BYTES, roots=roots or None)
    except safe_files.OutsideRoots:
        raise FolderError(
            f"{path}: its real path (symlinks followed) leaves the data roots {_roots_text(roots)}"
        ) from None
    except safe_files.UnsafeFile as exc:
        raise FolderError(f"{path}: {exc}") from None
    except OSError as exc:
        raise FolderError(f"{path}: {exc.strerror or type(exc).__name__}") from None
    return raw.decode("utf-8", errors="replace"), cut


def _present(path: Path) -> bool:
    """Something is there (a link, a FIFO, a folder: read, and refused, rather than skipped)."""
    return os.path.lexists(path)


def _yaml(text: str, where: Path) -> dict[str, Any]:
    try:
        data = safe_files.load_yaml(text)
    except safe_files.UnsafeFile as exc:
        raise FolderError(f"{where}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FolderError(f"{where}: its YAML is not a mapping")
    return data


def card_data(folder: str | Path, roots: Sequence[str | Path] = ()) -> dict[str, Any]:
    """The folder's card metadata: README.md's front matter, updated by .huggingface.yaml (each read
    only where its real path lies inside ``roots``, when given)."""
    folder = Path(folder)
    data: dict[str, Any] = {}
    readme = folder / CARD
    if _present(readme):
        text, cut = _read_head(readme, roots)  # only the front matter matters: the body may be long
        block = _front_matter(text)
        if block is None and cut and text.startswith("---"):
            raise FolderError(f"{readme}: its YAML front matter is longer than {CARD_MAX_BYTES} bytes")
        if block is not None:
            data.update(_yaml(block, readme))
    standalone = folder / STANDALONE_YAML
    if _present(standalone):
        text, cut = _read_head(standalone, roots)
        if cut:
            raise FolderError(f"{standalone}: longer than {CARD_MAX_BYTES} bytes")
        data.update(_yaml(text, standalone))
    return data


def _patterns(value: Any, where: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(p, str) and p for p in items):
        raise FolderError(f"{where}: expected a pattern or a list of patterns (non-empty strings)")
    return list(items)


def _split_name(split: Any, where: str) -> str:
    if not isinstance(split, str) or not SPLIT_NAME.match(split):
        raise FolderError(f"{where}: split {split!r} is not a split name (letters, digits, _)")
    return split


def _data_files(value: Any, where: str) -> dict[str, tuple[str, ...]]:
    """``data_files`` as ``datasets`` writes it in a card, as split -> patterns."""
    out: dict[str, list[str]] = {}
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        out[DEFAULT_SPLIT] = _patterns(value, where)
    elif isinstance(value, list):
        for item in value:
            if not isinstance(item, dict) or set(item) != {"split", "path"}:
                raise FolderError(f"{where}: each entry is a pattern or a {{split, path}} mapping")
            split = _split_name(item["split"], where)
            out.setdefault(split, []).extend(_patterns(item["path"], f"{where} split {split!r}"))
    elif isinstance(value, dict):
        for split, patterns in value.items():
            out[_split_name(split, where)] = _patterns(patterns, f"{where} split {split!r}")
    else:
        raise FolderError(f"{where}: expected a pattern, a list of patterns or a list of {{split, path}}")
    if sum(len(v) for v in out.values()) > MAX_PATTERNS:
        raise FolderError(f"{where}: more than {MAX_PATTERNS} patterns")
    return {split: tuple(patterns) for split, patterns in out.items()}


def card_configs(folder: str | Path, roots: Sequence[str | Path] = ()) -> dict[str, CardConfig]:
    """The configs of the folder's card, by name (empty without a card or without ``configs``)."""
    folder = Path(folder)
    raw = card_data(folder, roots).get("configs")
    if not raw:
        return {}
    where = folder / CARD
    if not isinstance(raw, list):
        raise FolderError(f"{where}: configs must be a list")
    out: dict[str, CardConfig] = {}
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("config_name"), str):
            raise FolderError(f"{where}: each of configs needs a config_name")
        name = entry["config_name"]
        at = f"{where} config {name!r}"
        if extra := sorted(str(k) for k in set(entry) - CONFIG_KEYS):
            raise FolderError(
                f"{at}: {', '.join(extra)} not supported here (only {', '.join(sorted(CONFIG_KEYS))}: the "
                "engine reads the data files itself)"
            )
        data_dir = entry.get("data_dir")
        if data_dir is not None and (not isinstance(data_dir, str) or not data_dir):
            raise FolderError(f"{at}: data_dir must be a folder name")
        files = entry.get("data_files")
        out[name] = CardConfig(
            name=name,
            data_dir=data_dir,
            data_files=None if files is None else _data_files(files, f"{at} data_files"),
            default=entry.get("default") is True,
        )
    return out


def pick_config(configs: dict[str, CardConfig], name: str | None, folder: str | Path) -> CardConfig | None:
    """The config ``name`` asks for (``datasets``' default rule without one); None: the card has none."""
    where = Path(folder) / CARD
    if not configs:
        if name not in (None, "default"):
            raise FolderError(f"{folder}: no config {name!r} (the folder's card defines no configs)")
        return None
    if name is not None:
        if name not in configs:
            raise FolderError(f"{where}: no config {name!r}; its configs: {', '.join(configs)}")
        return configs[name]
    defaults = [c for c in configs.values() if len(configs) == 1 or c.name == "default" or c.default]
    if len(defaults) != 1:
        raise FolderError(f"{where}: several configs ({', '.join(configs)}): name one with data.name")
    return defaults[0]


def _leaves(path: str, roots: Sequence[str | Path]) -> bool:
    return bool(roots) and not paths.real_inside(path, roots)


def _roots_text(roots: Iterable[str | Path]) -> str:
    return ", ".join(str(r) for r in roots)


class _Budget:
    """Entries the globs of one config may look at, together (paths.MAX_ENTRIES, like a walk)."""

    def __init__(self) -> None:
        self.left = paths.MAX_ENTRIES

    def spend(self, at: str) -> None:
        self.left -= 1
        if self.left < 0:
            raise FolderError(f"{at}: the patterns match more than {paths.MAX_ENTRIES} entries")


def _matches(pattern: str, base: str, at: str, budget: _Budget) -> list[str]:
    """The files ``pattern`` names (relative to ``base`` unless absolute)."""
    full = pattern if os.path.isabs(pattern) else os.path.join(base, pattern)
    if not paths.is_glob(full):
        if not os.path.isfile(full):
            raise FolderError(f"{at} {pattern!r}: no such file")
        return [full]
    out: list[str] = []
    for match in glob.iglob(full, recursive=True):  # lazily: the budget also ends a symlink loop
        budget.spend(f"{at} {pattern!r}")
        if os.path.isfile(match):
            out.append(match)
    if not out:
        raise FolderError(f"{at} {pattern!r}: matches no file")
    return sorted(out)


def _check_data_dir(config: CardConfig, base: str, roots: Sequence[str | Path], at: str) -> None:
    if _leaves(base, roots):
        raise FolderError(
            f"{at} data_dir {config.data_dir!r}: its real path {base} leaves the data roots "
            f"{_roots_text(roots)}"
        )
    if config.data_files is not None or not roots:
        return
    try:  # the conventional layout under data_dir reads whatever is there
        escapes = paths.escaping(base, roots)
    except paths.TooManyEntries as exc:
        raise FolderError(f"{at} data_dir: {exc}") from None
    if escapes:
        raise FolderError(
            f"{at} data_dir reads {escapes[0]}, whose real path (symlinks followed) leaves the data roots "
            f"{_roots_text(roots)}"
        )


def resolve_files(
    folder: str | Path, name: str | None, *, roots: Sequence[str | Path], allow_urls: bool
) -> FolderFiles:
    """The files one config of the folder's card reads, checked (see the module's docstring)."""
    real = os.path.realpath(folder)
    config = pick_config(card_configs(folder, roots), name, folder)
    if config is None:
        return FolderFiles(base=real, splits=None)
    at = f"{Path(folder) / CARD} config {config.name!r}"
    base = real
    if config.data_dir is not None:
        if is_url(config.data_dir):
            raise FolderError(f"{at} data_dir {config.data_dir!r}: a URL is not followed here")
        base = os.path.realpath(os.path.join(real, config.data_dir))
        _check_data_dir(config, base, roots, at)
    if config.data_files is None:
        return FolderFiles(base=base, splits=None)
    splits: dict[str, list[str]] = {}
    budget = _Budget()
    for split, patterns in config.data_files.items():
        files: list[str] = []
        for pattern in patterns:
            if is_url(pattern):
                if not allow_urls:
                    raise FolderError(
                        f"{at} data_files {pattern!r}: a URL in a dataset card is not followed"
                        + ("" if roots else " without data.allow_download")
                    )
                files.append(pattern)
                continue
            for match in _matches(pattern, base, f"{at} data_files", budget):
                if _leaves(match, roots):
                    raise FolderError(
                        f"{at} data_files {pattern!r} reads {match}, whose real path (symlinks followed) "
                        f"leaves the data roots {_roots_text(roots)}"
                    )
                files.append(os.path.realpath(match))
        splits[split] = list(dict.fromkeys(files))
    return FolderFiles(base=base, splits=splits)


# --- save_to_disk folders ---------------------------------------------------------------------------


def is_saved_dataset(folder: str | Path) -> bool:
    folder = Path(folder)
    return (folder / "dataset_dict.json").exists() or (folder / "state.json").exists()


def _json(path: Path, roots: Sequence[str | Path]) -> Any:
    text, cut = _read_head(path, roots)
    if cut:
        raise FolderError(f"{path}: longer than {CARD_MAX_BYTES} bytes")
    try:
        return safe_files.load_json(text)
    except safe_files.UnsafeFile as exc:
        raise FolderError(f"{path}: {exc}") from None


def _saved_split_files(split_dir: str, roots: Sequence[str | Path]) -> list[str]:
    state_path = Path(split_dir) / "state.json"
    state = _json(state_path, roots)
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not all(
        isinstance(f, dict) and isinstance(f.get("filename"), str) for f in files
    ):
        raise FolderError(f"{state_path}: _data_files is not a list of {{filename}}")
    return [os.path.join(split_dir, f["filename"]) for f in files]


def saved_files(folder: str | Path, roots: Sequence[str | Path] = ()) -> list[str]:
    """What ``load_from_disk(folder)`` opens: each split's folder (``dataset_dict.json``'s ``splits``)
    and the arrow files each ``state.json`` names, as joined there (not yet resolved). A manifest is
    read only where its real path lies inside ``roots``, when given."""
    folder = Path(folder)
    if not _present(folder / "dataset_dict.json"):
        return _saved_split_files(str(folder), roots)
    manifest = _json(folder / "dataset_dict.json", roots)
    names = manifest.get("splits") if isinstance(manifest, dict) else None
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise FolderError(f"{folder / 'dataset_dict.json'}: splits is not a list of names")
    out: list[str] = []
    for name in names:
        split_dir = os.path.join(folder, name)
        out.append(split_dir)
        if _leaves(split_dir, roots):  # refused by check_saved: its state.json is not read
            continue
        out.extend(_saved_split_files(split_dir, roots))
    return out


def check_saved(folder: str | Path, roots: Sequence[str | Path]) -> None:
    """Refuse a ``save_to_disk`` folder whose manifest names a split or a file outside the roots."""
    if not roots:
        return
    for entry in saved_files(folder, roots):
        if _leaves(entry, roots):
            raise FolderError(
                f"{folder}: its manifest names {entry}, whose real path (symlinks followed) leaves the "
                f"data roots {_roots_text(roots)}"
            )

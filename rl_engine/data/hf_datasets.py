"""Loading splits through Hugging Face ``datasets``: local files, ``save_to_disk`` directories, data
directories laid out like a hub repository, and hub datasets already in the local cache.

A data directory is never handed to ``datasets`` as a folder: its card could name files outside the data
roots or URLs (``rl_engine.dataset_folder``). The engine works out the split's files itself (the card's
``configs``, checked there, or ``datasets``' conventional layout of the folder) and loads them with
their builder and explicit ``data_files``.

A hub id is ``namespace/name``; a local folder of that name in the working directory wins over the hub
(``datasets``' own rule), except in the form ``hf://datasets/namespace/name``, which only ever means the
hub (and the datasets cache): the platform gives the engine hub ids in that form.

Offline unless ``data.allow_download``: ``datasets`` would otherwise try the hub first and, on a machine
without network, spend tens of seconds in retries before it falls back to its cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rl_engine import dataset_folder, paths
from rl_engine.config import DatasetDataConfig
from rl_engine.data.rows import DataError, check_local_data

_EXTENSIONS = {
    ".parquet": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".arrow": "arrow",
}


@contextlib.contextmanager
def _hub_offline(offline: bool) -> Iterator[None]:
    """Force offline mode for this call only. ``datasets`` and ``huggingface_hub`` read the flag from
    module constants set at import time, so the environment variable alone is too late here."""
    import datasets.config as ds_config
    import huggingface_hub.constants as hub_constants

    saved = ds_config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE
    if offline:
        ds_config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        ds_config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def _file_format(path: str, configured: str) -> str:
    if configured != "auto":
        return configured
    suffix = Path(path.replace("*", "x")).suffix.lower()
    if suffix not in _EXTENSIONS:
        raise DataError(
            f"cannot tell the format of {path!r} from its extension; set data.format "
            f"({', '.join(sorted(set(_EXTENSIONS.values())))})"
        )
    return _EXTENSIONS[suffix]


HUB_URL = "hf://datasets/"


def _is_single_file(path: str) -> bool:
    if path.startswith("hf://"):
        return False
    return Path(path).expanduser().is_file() or any(ch in path for ch in "*?[")


def _pick_split(obj: Any, split: str, where: str) -> Any:
    """A split of a DatasetDict (or the Dataset itself when it is not a dict)."""
    if not hasattr(obj, "keys"):
        return obj
    if split not in obj:
        raise DataError(f"{where}: no split {split!r}; its splits: {', '.join(obj.keys())}")
    return obj[split]


def _conventional_files(base: str) -> dict[str, list[str]]:
    """``datasets``' own layout rules for a folder without card configs (``data/train-*``,
    ``train.csv``, ``train/``, ``test*``... or every file as ``train``), through its public pattern
    helpers: the files lie inside ``base`` (what the data-roots walk covered)."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    patterns = get_data_patterns(base)
    return {str(split): list(files) for split, files in DataFilesDict.from_patterns(patterns, base).items()}


def _folder_format(files: list[str], configured: str, where: str, *, named: bool) -> tuple[str, list[str]]:
    """The builder for a split's files and the files it reads. Files of the folder's layout whose
    extension no builder here reads are left out (a LICENSE, a .gitattributes); files the card names
    must all be readable."""
    if configured != "auto":
        return configured, files
    by_format: dict[str, list[str]] = {}
    for f in files:
        suffix = Path(f.replace("*", "x")).suffix.lower()
        if suffix in _EXTENSIONS:
            by_format.setdefault(_EXTENSIONS[suffix], []).append(f)
        elif named:
            _file_format(f, configured)  # raises, naming the file
    if len(by_format) != 1:
        found = ", ".join(sorted(by_format)) or "none"
        raise DataError(
            f"{where}: expected the files of one format ({', '.join(sorted(set(_EXTENSIONS.values())))}), "
            f"found {found}; set data.format"
        )
    [(builder, kept)] = by_format.items()
    return builder, kept


def _load_folder(cfg: DatasetDataConfig, path: str, split: str, kwargs: dict[str, Any]) -> Any:
    """A split of a data folder, from the files the engine resolved (never the folder's card)."""
    import datasets

    roots = paths.roots_from_env()
    try:
        # a URL in the card only for the CLI with downloads on; a platform job (roots) never follows one
        layout = dataset_folder.resolve_files(
            path, cfg.name, roots=roots, allow_urls=cfg.allow_download and not roots
        )
    except dataset_folder.FolderError as exc:
        raise DataError(str(exc)) from None
    named = layout.splits is not None
    splits = layout.splits if layout.splits is not None else _conventional_files(layout.base)
    if split not in splits:
        raise DataError(f"{path}: no split {split!r}; its splits: {', '.join(splits) or 'none'}")
    for f in splits[split]:
        if not dataset_folder.is_url(f) and roots and not paths.real_inside(f, roots):
            raise DataError(f"{path}: reads {f}, whose real path leaves the data roots {', '.join(roots)}")
    builder, files = _folder_format(splits[split], cfg.format, f"{path} split {split!r}", named=named)
    return datasets.load_dataset(builder, data_files={split: files}, split=split, **kwargs)


def _load(cfg: DatasetDataConfig, path: str, split: str) -> Any:
    import datasets

    kwargs: dict[str, Any] = {"cache_dir": cfg.cache_dir} if cfg.cache_dir else {}
    if path.startswith("hf://"):
        if not path.startswith(HUB_URL) or path.removeprefix(HUB_URL).count("/") != 1:
            raise DataError(f"{path}: a hub dataset is hf://datasets/namespace/name")
        # `datasets` resolves this form on the hub and in its cache only (never a local folder).
        return datasets.load_dataset(path, cfg.name, split=split, **kwargs)
    p = Path(path).expanduser()
    if p.exists() or _is_single_file(path):
        check_local_data(path)
    if p.is_dir() and dataset_folder.is_saved_dataset(p):
        try:
            dataset_folder.check_saved(p, paths.roots_from_env())
        except dataset_folder.FolderError as exc:
            raise DataError(str(exc)) from None
        return _pick_split(datasets.load_from_disk(str(p)), split, path)
    if _is_single_file(path):
        # A single file (or glob) is one split whatever its name: map it to the split asked for.
        builder = _file_format(path, cfg.format)
        return datasets.load_dataset(builder, data_files={split: str(p)}, split=split, **kwargs)
    if p.is_dir():
        return _load_folder(cfg, str(p), split, kwargs)
    if path.startswith((".", "/", "~")) or path.count("/") > 1:
        raise DataError(f"{path}: no such file or directory")
    return datasets.load_dataset(path, cfg.name, split=split, **kwargs)  # a hub id (cache unless allowed)


def load_split(cfg: DatasetDataConfig, path: str, split: str) -> Any:
    """One split as a ``datasets.Dataset``; every failure becomes a one-line ``DataError``."""
    import datasets
    from datasets.utils import logging as ds_logging

    ds_logging.set_verbosity_error()  # "using the latest cached version" warnings, per call
    datasets.disable_progress_bars()
    where = f"{path}" + (f" ({cfg.name})" if cfg.name else "") + f" split {split!r}"
    try:
        with _hub_offline(not cfg.allow_download):
            return _load(cfg, path, split)
    except DataError:
        raise
    except ConnectionError as exc:
        hint = (
            ""
            if cfg.allow_download
            else " (offline: only local files and the datasets cache; see data.allow_download)"
        )
        raise DataError(f"{where}: {exc}{hint}") from None
    except (FileNotFoundError, ValueError, KeyError, OSError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{where}: {msg}") from None
    except Exception as exc:  # datasets raises its own types (DatasetNotFoundError, builder errors)
        msg = str(exc).splitlines()[0] if str(exc) else ""
        raise DataError(f"{where}: {type(exc).__name__}: {msg}") from None


def ensure_dataset(cfg: DatasetDataConfig) -> None:
    """Generate the synthetic dataset at ``cfg.path`` when it is configured and missing."""
    if cfg.synthetic is None:
        return
    if cfg.path.startswith("hf://"):
        raise DataError(
            f"data.synthetic writes a local dataset directory; data.path {cfg.path!r} is a hub id"
        )
    from rl_engine.data.gsm8k_style import add_transfer, write_dataset

    if Path(cfg.path).exists():
        add_transfer(cfg.synthetic, cfg.path)  # a folder written before its spec asked for a transfer split
        return
    write_dataset(cfg.synthetic, cfg.path)


def load_named_split(cfg: DatasetDataConfig, split: str) -> Any:
    """The split ``split`` of ``cfg.path`` (one of ``data.extra_validation_splits``)."""
    ensure_dataset(cfg)
    if _is_single_file(cfg.path):
        raise DataError(
            f"{cfg.path} is a single file, which holds one split: it has no split {split!r} "
            "(data.extra_validation_splits)"
        )
    return load_split(cfg, cfg.path, split)


def load_train_split(cfg: DatasetDataConfig) -> Any:
    ensure_dataset(cfg)
    ds = load_split(cfg, cfg.path, cfg.train_split)
    if cfg.max_rows is not None and cfg.max_rows < len(ds):
        ds = ds.select(range(cfg.max_rows))
    return ds


def load_validation_split(cfg: DatasetDataConfig) -> Any | None:
    ensure_dataset(cfg)
    if cfg.validation_path:
        return load_split(cfg, cfg.validation_path, "validation")
    if cfg.validation_split:
        if _is_single_file(cfg.path):
            raise DataError(
                f"{cfg.path} is a single file, which holds one split: use data.validation_path for a "
                f"validation file instead of data.validation_split={cfg.validation_split!r}"
            )
        return load_split(cfg, cfg.path, cfg.validation_split)
    return None

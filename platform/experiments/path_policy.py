"""Where a config that comes through the platform may point the engine: the configured roots, hub dataset
ids, MLflow servers (settings ``MODEL_ROOTS``, ``DATA_ROOTS``, ``ALLOWED_MODELS``, ``ALLOWED_DATASETS``,
``ALLOW_DATASET_DOWNLOADS``, ``ALLOWED_MLFLOW_SERVERS``; docs/api.md, "Trust boundary").

The rules themselves (which field, which message) are in ``experiments.config_policy``; this module
answers the questions they ask about one value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Literal

from django.conf import settings

from experiments.run_files import is_inside
from rl_engine import dataset_folder, paths
from rl_engine.strict_url import UrlError, parse_strict_url

# The form `datasets` resolves on the hub and in its cache only, never as a local folder (datasets >= 5).
HUB_URL = "hf://datasets/"
# A hub dataset repository: `namespace/name`. One slash exactly: a bare name is also the name of one of
# `datasets`' packaged builders (`json`, `parquet`...), which read the files of the working directory.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


# What data paths read, remembered while :func:`data_walks_once` is active: (question, path, ...) -> answer.
_walks: ContextVar[dict[tuple[object, ...], object] | None] = ContextVar("data_walks", default=None)


@contextmanager
def data_walks_once() -> Iterator[None]:
    """Within it each distinct data path is walked (and its folder's card resolved) once, whatever
    number of configs name it: a sweep checks every point's config, then run_create checks each again.
    Only for the span of one request: the engine checks again right before it reads."""
    token = _walks.set({})
    try:
        yield
    finally:
        _walks.reset(token)


def _remembered(key: tuple[object, ...], compute):  # type: ignore[no-untyped-def]
    memo = _walks.get()
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]


@dataclass(frozen=True)
class DataRef:
    """What a data field's value names: a local path (absolute, normalised) or a hub dataset id."""

    kind: Literal["path", "hub"]
    value: str

    def for_engine(self) -> str:
        """The value the job's config gets: the path the policy checked, or the hub-only form of the id."""
        return self.value if self.kind == "path" else HUB_URL + self.value


@dataclass(frozen=True)
class PathPolicy:
    model_roots: tuple[Path, ...]
    data_roots: tuple[Path, ...]
    allowed_models: frozenset[str]
    workdir: Path  # the engine job's working directory: relative paths count from there
    allowed_datasets: tuple[str, ...] = ("*",)  # shell-style patterns of hub dataset ids
    allow_downloads: bool = True
    mlflow_servers: tuple[str, ...] = ()  # http(s) origins (optionally with a path prefix), or "*"
    reward_services: tuple[str, ...] = ()  # http(s) URLs a remote reward may post to (and below), or "*"

    @classmethod
    def from_settings(cls) -> PathPolicy:
        workdir = getattr(settings, "ENGINE_WORKDIR", "") or settings.BASE_DIR
        return cls(
            model_roots=tuple(Path(p) for p in settings.MODEL_ROOTS),
            data_roots=tuple(Path(p) for p in settings.DATA_ROOTS),
            allowed_models=frozenset(settings.ALLOWED_MODELS),
            workdir=Path(workdir),
            allowed_datasets=tuple(getattr(settings, "ALLOWED_DATASETS", ["*"])),
            allow_downloads=bool(getattr(settings, "ALLOW_DATASET_DOWNLOADS", True)),
            mlflow_servers=tuple(getattr(settings, "ALLOWED_MLFLOW_SERVERS", [])),
            reward_services=tuple(getattr(settings, "ALLOWED_REWARD_SERVICES", [])),
        )

    def absolute(self, value: str) -> str:
        """``value`` as the engine resolves it (from its working directory), with ``..`` removed."""
        return os.path.normpath(value if os.path.isabs(value) else str(self.workdir / value))

    def under(self, value: str, roots: tuple[Path, ...]) -> bool:
        return any(is_inside(self.absolute(value), root) for root in roots)

    def model_place(self, value: str) -> str | None:
        """Where the job reads a model field's ``value``: an allowed model's name as it is, a path under
        MODEL_ROOTS made absolute; None where the policy refuses it. The one resolution of a model path
        for both the check and the placement."""
        if value in self.allowed_models:
            return value
        return self.absolute(value) if self.under(value, self.model_roots) else None

    def data_ref(self, value: str, *, hub: bool) -> DataRef | None:
        """A path under DATA_ROOTS, else (where ``hub``) a hub id ``namespace/name`` or its
        ``hf://datasets/namespace/name`` form; None for anything else."""
        if value.startswith("hf://"):
            repo = value.removeprefix(HUB_URL) if value.startswith(HUB_URL) else ""
            return DataRef("hub", repo) if hub and HUB_ID.match(repo) else None
        if self.under(value, self.data_roots):
            return DataRef("path", self.absolute(value))
        return DataRef("hub", value) if hub and HUB_ID.match(value) else None

    def data_escapes(self, ref: DataRef) -> list[str]:
        """Entries a local data path would read (the file, a glob's matches, a folder's files, walked
        now) whose real path leaves DATA_ROOTS: a symlink inside a root may point anywhere."""
        if ref.kind != "path":
            return []

        def walk() -> list[str]:
            try:
                return paths.escaping(ref.value, self.data_roots)
            except paths.TooManyEntries as exc:
                return [str(exc)]

        return list(_remembered(("escapes", ref.value, self.data_roots), walk))

    def data_folder_problem(self, ref: DataRef, config_name: str | None) -> str | None:
        """What a local data folder's card (or ``save_to_disk`` manifest) would make the job read that it
        may not: a file whose real path leaves DATA_ROOTS, or any URL (``rl_engine.dataset_folder``,
        the engine's own resolver; a job never follows a URL in a card)."""
        if ref.kind != "path" or not os.path.isdir(ref.value):
            return None

        def resolve() -> str | None:
            try:
                if dataset_folder.is_saved_dataset(ref.value):
                    dataset_folder.check_saved(ref.value, self.data_roots)
                else:
                    dataset_folder.resolve_files(
                        ref.value, config_name, roots=self.data_roots, allow_urls=False
                    )
            except (dataset_folder.FolderError, OSError) as exc:
                return str(exc)
            return None

        return _remembered(("folder", ref.value, config_name, self.data_roots), resolve)

    def dataset_allowed(self, hub_id: str) -> bool:
        return any(fnmatchcase(hub_id, pattern) for pattern in self.allowed_datasets)

    def mlflow_server_ok(self, uri: str) -> bool:
        """An http(s) URI on one of the allowed MLflow servers (``url_allowed``)."""
        return url_allowed(uri, self.mlflow_servers)

    def reward_service_ok(self, uri: str) -> bool:
        """An http(s) URL of one of the allowed remote reward services (``url_allowed``)."""
        return url_allowed(uri, self.reward_services)


def url_allowed(uri: str, entries: tuple[str, ...]) -> bool:
    """``uri`` is within one of ``entries`` ("*": any): both read by the one strict parser
    (``rl_engine.strict_url``), same scheme, host and port exactly, and under the entry's path. An entry
    that does not parse allows nothing."""
    try:
        url = parse_strict_url(uri)
    except UrlError:
        return False
    for entry in entries:
        if entry == "*":
            return True
        try:
            if url.within(parse_strict_url(entry)):
                return True
        except UrlError:
            continue
    return False


def roots_text(roots: tuple[Path, ...]) -> str:
    return ", ".join(str(r) for r in roots) or "(none configured)"


def list_text(items: tuple[str, ...] | frozenset[str]) -> str:
    return ", ".join(sorted(items)) or "none"

"""The rewards, tasks and environments the ENGINE's environment offers (``GET /api/rewards``,
``GET /api/tasks``, ``rlp rewards``, the config check that refuses a reward the engine lacks, and the
form's ``env.name`` choices).

Runs execute where ``ENGINE_PYTHON`` runs (another image, another virtual environment: reward plugins
are packages installed there), not necessarily in this web process, so the list is the engine's own
answer: ``<ENGINE_PYTHON> -m rl_engine rewards --json`` (and ``tasks --json``, ``envs --json``) run in ``ENGINE_WORKDIR``
in a child process with a timeout, its answer kept for ``CACHE_S`` seconds. Without ``ENGINE_PYTHON`` the
engine is this interpreter and this repository's ``rl_engine`` (on its ``PYTHONPATH``).

The child gets a small environment (``PATH``, ``HOME``, the locale, ``VIRTUAL_ENV``): none of this
process's settings or secrets.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)

CACHE_S = 60.0
TIMEOUT_S = 60.0
MAX_OUTPUT = 4 * 1024 * 1024  # bytes of JSON at most
KINDS = ("rewards", "tasks", "envs")
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "VIRTUAL_ENV", "TMPDIR")

_cache: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}
_lock = threading.Lock()


class CatalogueUnavailable(RuntimeError):
    """The engine's environment did not answer with a catalogue (not found, failed, timed out, not JSON
    of the expected shape): one line saying which."""


def engine_python() -> str:
    return str(getattr(settings, "ENGINE_PYTHON", "") or sys.executable)


def engine_workdir() -> str:
    return str(getattr(settings, "ENGINE_WORKDIR", "") or settings.BASE_DIR)


def _command(kind: str) -> tuple[list[str], str, dict[str, str]]:
    python = engine_python()
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    if not getattr(settings, "ENGINE_PYTHON", ""):  # this interpreter: the engine is this repository's
        env["PYTHONPATH"] = str(settings.BASE_DIR)
    workdir = engine_workdir()
    if not os.path.isdir(workdir):
        workdir = str(settings.BASE_DIR)
    return [python, "-m", "rl_engine", kind, "--json"], workdir, env


def _read(kind: str) -> dict[str, Any]:
    argv, workdir, env = _command(kind)
    try:
        done = subprocess.run(
            argv,
            cwd=workdir,
            env=env,
            capture_output=True,
            timeout=TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise CatalogueUnavailable(
            f"the engine ({argv[0]}) did not list its {kind} within {TIMEOUT_S:.0f}s"
        ) from None
    except OSError as exc:
        raise CatalogueUnavailable(f"the engine's interpreter {argv[0]!r} did not start: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise CatalogueUnavailable(
            f"the engine ({argv[0]}) failed to list its {kind} (exit {done.returncode}): {last[:300]}"
        )
    if len(done.stdout) > MAX_OUTPUT:
        raise CatalogueUnavailable(f"the engine's list of {kind} is larger than {MAX_OUTPUT} bytes")
    try:
        document = json.loads(done.stdout)
    except ValueError:
        raise CatalogueUnavailable(f"the engine's list of {kind} is not JSON") from None
    entries = document.get(kind) if isinstance(document, dict) else None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries
    ):
        raise CatalogueUnavailable(f"the engine's list of {kind} has no {kind!r} list of named entries")
    return document


def catalogue(kind: str) -> dict[str, Any]:
    """The engine's ``rewards``, ``tasks`` or ``envs`` document (``python -m rl_engine <kind> --json``), at most
    ``CACHE_S`` old; CatalogueUnavailable when the engine does not answer (not cached: the next call
    asks again)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}")
    argv, workdir, _ = _command(kind)
    key = (argv[0], workdir, kind)
    now = time.monotonic()
    with _lock:
        hit = _cache.get(key)
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1]
    document = _read(kind)
    with _lock:
        _cache[key] = (time.monotonic(), document)
    return document


def engine_rewards() -> dict[str, dict[str, Any]]:
    """The rewards the engine offers, by name (a plugin that does not load there carries ``error``)."""
    return {entry["name"]: entry for entry in catalogue("rewards")["rewards"]}


def engine_environments() -> dict[str, dict[str, Any]]:
    """The environments the engine offers (``env.name``), by name: built-ins and installed plugins."""
    return {entry["name"]: entry for entry in catalogue("envs")["envs"]}


def cache_clear() -> None:
    with _lock:
        _cache.clear()

"""The launch spec: everything a platform (or any launcher) tells the engine when it starts a run.

The engine is started as ``python -m rl_engine train --config <file>``; the spec is what goes into that
file and into the job's environment. The platform's launcher builds a :class:`JobSpec` and writes
``engine_config()`` and ``env()``; inside the job the HTTP sink reads its half back with
:meth:`IngestSpec.from_env`. One definition of the names on both sides. Pydantic only: no torch, ray or
Django (a test checks it).

The environment variables (``RL_ENGINE_*``) are also how a user of the CLI points the ``http`` sink at a
platform by hand (docs/engine.md, "Sinks").
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rl_engine import paths

URL = "RL_ENGINE_INGEST_URL"  # the platform's base URL
RUN_ID = "RL_ENGINE_RUN_ID"
TOKEN_FILE = "RL_ENGINE_INGEST_TOKEN_FILE"  # absolute path of a file holding the ingest token
TOKEN = "RL_ENGINE_INGEST_TOKEN"  # the token itself (a CLI user's; the platform never sets it)
SPOOL_DIR = "RL_ENGINE_SPOOL_DIR"
HEARTBEAT_S = "RL_ENGINE_HEARTBEAT_S"
CLOSE_TIMEOUT_S = "RL_ENGINE_CLOSE_TIMEOUT_S"
FLUSH_S = "RL_ENGINE_FLUSH_S"

HTTP_SINK = "http"  # the name of the sink in ``logging.sinks``


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class IngestSpec(_Spec):
    """Where and how the HTTP sink reports a run. The token comes from ``token_file`` (what the platform
    sets: a job's environment is shown by the Ray dashboard, a file is not) or ``token``; the file wins."""

    url: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    token_file: str | None = None
    token: str | None = Field(None, repr=False)
    spool_dir: str | None = None
    heartbeat_s: float = Field(10.0, gt=0)
    close_timeout_s: float = Field(60.0, ge=0)
    flush_s: float = Field(0.05, ge=0, description="the wait after the first queued item")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> IngestSpec:
        """Read from ``RL_ENGINE_*`` variables; a ValueError names the one that is missing or wrong."""
        env = os.environ if env is None else env
        missing = [n for n in (URL, RUN_ID) if not env.get(n)]
        token_file = env.get(TOKEN_FILE) or None
        token = env.get(TOKEN) or None
        if not token_file and not token:
            missing.insert(1, f"{TOKEN_FILE} (or {TOKEN})")
        if missing:
            raise ValueError(f"logging.sinks includes 'http' but {', '.join(missing)} is not set")
        if token_file and not os.path.isabs(token_file):
            raise ValueError(f"{TOKEN_FILE} must be an absolute path, got {token_file!r}")
        return cls(
            url=env[URL],
            run_id=env[RUN_ID],
            token_file=token_file,
            token=None if token_file else token,
            spool_dir=env.get(SPOOL_DIR) or None,
            heartbeat_s=float(env.get(HEARTBEAT_S, "10")),
            close_timeout_s=float(env.get(CLOSE_TIMEOUT_S, "60")),
            flush_s=float(env.get(FLUSH_S, "0.05")),
        )

    def env(self) -> dict[str, str]:
        """The variables :meth:`from_env` reads back: a token itself only when there is no file, the
        optional ones only when given (so a value the job inherits, e.g. a benchmark's flush interval,
        is not overridden by a default)."""
        out = {URL: self.url, RUN_ID: self.run_id}
        if self.token_file:
            out[TOKEN_FILE] = self.token_file
        elif self.token:
            out[TOKEN] = self.token
        for name, field in _OPTIONAL.items():
            value = getattr(self, field)
            if field in self.model_fields_set and value is not None:
                out[name] = str(value)
        return out


_OPTIONAL = {SPOOL_DIR: "spool_dir", HEARTBEAT_S: "heartbeat_s", CLOSE_TIMEOUT_S: "close_timeout_s",
             FLUSH_S: "flush_s"}  # fmt: skip


class JobSpec(_Spec):
    """One run as the engine gets it: the run's frozen config (validated when the run was created: it
    is not validated again here, the engine does when it loads the file), where it checkpoints, where
    it resumes from, the sinks added to the config's own, and where the HTTP sink reports."""

    config: dict[str, Any]
    checkpoint_dir: str
    resume_from: str | None = None
    sinks: tuple[str, ...] = (HTTP_SINK,)
    progress_bar: bool = False  # carriage-return bars make unreadable run events
    ingest: IngestSpec
    # Where the job may read local data from (the platform's DATA_ROOTS): the engine refuses a data
    # file, glob match or folder entry whose real path leaves them (rl_engine.paths). Empty: no check.
    data_roots: tuple[str, ...] = ()

    @property
    def run_id(self) -> str:
        return self.ingest.run_id

    def engine_config(self) -> dict[str, Any]:
        """The config file's content: the frozen config with this spec's fields set."""
        out = copy.deepcopy(self.config)
        trainer = out.setdefault("trainer", {})
        trainer["checkpoint_dir"] = self.checkpoint_dir
        trainer["resume_from"] = self.resume_from
        logging_cfg = out.setdefault("logging", {})
        sinks = list(logging_cfg.get("sinks") or ["stdout"])
        sinks += [s for s in self.sinks if s not in sinks]
        logging_cfg["sinks"] = sinks
        logging_cfg["progress_bar"] = self.progress_bar
        return out

    def env(self) -> dict[str, str]:
        """The job's environment for the engine's sinks (and the data roots, when set)."""
        out = self.ingest.env()
        if self.data_roots:
            out[paths.ROOTS_ENV] = os.pathsep.join(self.data_roots)
        return out

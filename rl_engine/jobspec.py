"""The seam between a launcher and the engine: what to train and where it runs, kept apart.

A :class:`JobSpec` is an ``ExperimentConfig`` (what to train: the user's), a :class:`Placement` (where
it runs: run folder, checkpoint folder, resume checkpoint, cluster, log and tracker locations, data
roots, where the config's model and data paths point on the cluster: the launcher's) and an
:class:`IngestSpec` (where the HTTP sink reports). Each field has one writer. The platform's launcher
builds one per run and starts ``python -m rl_engine train --config <file>`` with ``spec_document()`` in
that file and ``env()`` in the job's environment; inside the job the HTTP sink reads its half back with
:meth:`IngestSpec.from_env`. A user of the CLI gives a plain config instead and the placement by flags
(``rl_engine.cli``). One definition of the names on both sides. Pydantic only: no torch, ray or Django
(a test checks it).

The environment variables (``RL_ENGINE_*``) are also how a user of the CLI points the ``http`` sink at a
platform by hand (docs/engine.md, "Sinks").
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rl_engine import paths
from rl_engine.config import ConfigError, ExperimentConfig, FieldError, SinkName, validation_errors
from rl_engine.strict_url import url_problem

URL = "RL_ENGINE_INGEST_URL"  # the platform's base URL
RUN_ID = "RL_ENGINE_RUN_ID"
TOKEN_FILE = "RL_ENGINE_INGEST_TOKEN_FILE"  # absolute path of a file holding the ingest token
TOKEN = "RL_ENGINE_INGEST_TOKEN"  # the token itself (a CLI user's; the platform never sets it)
SPOOL_DIR = "RL_ENGINE_SPOOL_DIR"
HEARTBEAT_S = "RL_ENGINE_HEARTBEAT_S"
CLOSE_TIMEOUT_S = "RL_ENGINE_CLOSE_TIMEOUT_S"
FLUSH_S = "RL_ENGINE_FLUSH_S"

HTTP_SINK = "http"  # the name of the sink in ``logging.sinks``
# What goes into a run folder (Placement.run_dir) when no location of its own is given.
JSONL_NAME, MLFLOW_DB, MLFLOW_ARTIFACTS, WANDB_DIR = "metrics.jsonl", "mlflow.db", "mlflow-artifacts", "wandb"
_LOCAL_STORE = re.compile(r"^sqlite:///([^/]+)$")  # an MLflow store named relative to the working dir


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


class InputPaths(_Spec):
    """Where the config's model and data paths are read on the cluster, where that is not the config's
    own text: the launcher's resolution of what its policy checked (an absolute path for a relative
    one, a model ``model.tiny`` builds or a dataset ``data.synthetic`` generates in the project's own
    folder, a hub dataset id in its hub-only form ``hf://datasets/...``). None: the config's value."""

    model_path: str | None = None
    tokenizer_path: str | None = None
    data_path: str | None = None
    validation_path: str | None = None
    data_cache_dir: str | None = None

    def applied_to(self, cfg: ExperimentConfig) -> ExperimentConfig:
        """The config the engine runs: ``cfg`` reading its inputs from these paths."""
        model = {"path": self.model_path, "tokenizer_path": self.tokenizer_path}
        data = {
            "path": self.data_path,
            "validation_path": self.validation_path,
            "cache_dir": self.data_cache_dir,
        }
        model = {k: v for k, v in model.items() if v is not None}
        data = {k: v for k, v in data.items() if v is not None and k in type(cfg.data).model_fields}
        if not model and not data:
            return cfg
        return cfg.model_copy(
            update={"model": cfg.model.model_copy(update=model), "data": cfg.data.model_copy(update=data)}
        )


class Placement(_Spec):
    """Where a run runs. The platform's launcher writes every field (``launcher.placement``); the CLI
    takes them from flags (``--checkpoint-dir`` ...), defaults otherwise: no checkpoints, no resume, a
    private Ray, the progress bar on."""

    run_dir: str | None = Field(
        None,
        description="The run's own folder: its JSONL log, a local MLflow store with its artifacts and its "
        "W&B files go there unless placed below.",
    )
    checkpoint_dir: str | None = Field(None, description="Where checkpoints go; None disables them.")
    resume_from: str | None = Field(None, description="A checkpoint directory to resume from.")
    ray_address: str | None = Field(
        None, description="Ray cluster to join (auto, host:port or ray://host:port); None: start a local one."
    )
    jsonl_path: str | None = Field(None, description="The JSONL log (logging.sinks jsonl).")
    mlflow_artifact_location: str | None = Field(
        None, description="Artifact root of a new MLflow experiment; default: the tracking server's."
    )
    wandb_dir: str | None = Field(None, description="Where W&B keeps its files; default: ./wandb.")
    sinks: tuple[SinkName, ...] = Field((), description="Sinks added to the config's logging.sinks.")
    progress_bar: bool = True  # a platform job has none: carriage-return bars make unreadable run events
    # Where the job may read local data from (the platform's DATA_ROOTS): the engine refuses a data
    # file, glob match or folder entry whose real path leaves them (rl_engine.paths). Empty: no check.
    data_roots: tuple[str, ...] = ()
    inputs: InputPaths = Field(default_factory=InputPaths)

    @field_validator("ray_address")
    @classmethod
    def _strict_ray_address(cls, v: str | None) -> str | None:
        if v is None or v == "auto":
            return v
        problem = url_problem(v if "://" in v else f"ray://{v}", schemes=("ray",))
        if problem:
            raise ValueError(f"the address {problem} (docs/api.md, Trust boundary)")
        return v

    def all_sinks(self, config_sinks: list[str]) -> list[str]:
        """The config's sinks, then the placement's (each once)."""
        return list(dict.fromkeys([*config_sinks, *self.sinks]))

    def _in_run_dir(self, name: str) -> str | None:
        return os.path.join(self.run_dir, name) if self.run_dir else None

    def jsonl_file(self) -> str | None:
        return self.jsonl_path or self._in_run_dir(JSONL_NAME)

    def wandb_folder(self) -> str | None:
        return self.wandb_dir or self._in_run_dir(WANDB_DIR)

    def mlflow_store(self, tracking_uri: str | None) -> tuple[str | None, str | None]:
        """(tracking URI, artifact location) of the run's MLflow mirror, given the config's URI: with a
        run folder, a local store (none named, or ``sqlite:///NAME.db``) and its artifacts go into it."""
        local = _LOCAL_STORE.match(tracking_uri or f"sqlite:///{MLFLOW_DB}")
        if self.run_dir and local:
            artifacts = self.mlflow_artifact_location or self._in_run_dir(MLFLOW_ARTIFACTS)
            return f"sqlite:///{os.path.join(self.run_dir, local.group(1))}", artifacts
        return tracking_uri, self.mlflow_artifact_location


class JobSpec(_Spec):
    """One run as the engine gets it. ``config``: what to train; ``placement``: where; ``ingest``: where
    the HTTP sink reports (travels in the job's environment, ``env()``, not in the spec's file)."""

    config: ExperimentConfig
    placement: Placement = Field(default_factory=Placement)
    ingest: IngestSpec | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _sinks_have_places(self) -> JobSpec:
        if "jsonl" in self.placement.all_sinks(self.config.logging.sinks) and not self.placement.jsonl_file():
            raise FieldError(
                "config.logging.sinks",
                "includes 'jsonl' but the placement has no JSONL file: give it a jsonl_path or a run_dir "
                "(the CLI's --jsonl-path FILE or --run-dir DIR)",
            )
        return self

    @property
    def run_id(self) -> str | None:
        return self.ingest.run_id if self.ingest else None

    def run_config(self) -> ExperimentConfig:
        """The config the engine runs: the user's, its model and data read where the placement says."""
        return self.placement.inputs.applied_to(self.config)

    def spec_document(self) -> dict[str, Any]:
        """What the spec's file holds (``python -m rl_engine train --config FILE`` reads it back)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_document(cls, data: Any) -> JobSpec:
        """Read a spec's file content; ConfigError with field paths (``config.trainer.lr``, ``placement.
        ray_address``) when it is not one."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(validation_errors(exc, cls)) from None

    def env(self) -> dict[str, str]:
        """The job's environment for the engine's sinks (and the data roots, when set)."""
        out = self.ingest.env() if self.ingest else {}
        if self.placement.data_roots:
            out[paths.ROOTS_ENV] = os.pathsep.join(self.placement.data_roots)
        return out


def is_spec_document(data: Any) -> bool:
    """A spec's file (``config`` + ``placement``) rather than a plain config (which has neither key)."""
    return isinstance(data, dict) and "placement" in data and "config" in data

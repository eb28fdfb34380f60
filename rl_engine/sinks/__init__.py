"""Metrics sinks: the engine's only output channel (stdout, JSONL file, progress bar, platform HTTP)."""

from __future__ import annotations

from rl_engine.config import LoggingConfig
from rl_engine.sinks.base import JsonlSink, MetricsSink, MultiSink, ProgressSink, StdoutSink


def build_sinks(logging_cfg: LoggingConfig, *, total_steps: int | None = None) -> MetricsSink:
    """The sinks listed in ``logging.sinks``, plus a progress bar when ``progress_bar`` is on and
    ``total_steps`` is given. ``http`` reads RL_ENGINE_INGEST_URL / _TOKEN / RL_ENGINE_RUN_ID."""
    sinks: list[MetricsSink] = []
    for name in logging_cfg.sinks:
        if name == "stdout":
            sinks.append(StdoutSink(every=logging_cfg.log_every))
        elif name == "jsonl":
            if not logging_cfg.jsonl_path:
                raise ValueError("logging.sinks includes 'jsonl': set logging.jsonl_path")
            sinks.append(JsonlSink(logging_cfg.jsonl_path))
        elif name == "http":
            from rl_engine.sinks.http import HttpSink  # the platform client, only when asked for

            _token_from_file()
            sinks.append(HttpSink.from_env())
    if logging_cfg.progress_bar and total_steps:
        sinks.append(ProgressSink(total_steps))
    return sinks[0] if len(sinks) == 1 else MultiSink(sinks)


def _token_from_file() -> None:
    """RL_ENGINE_INGEST_TOKEN_FILE (what the platform's launcher sets: the token must not travel in the
    Ray job's environment, which the dashboard shows) -> RL_ENGINE_INGEST_TOKEN of this process only.
    To be folded into HttpSink.from_env."""
    import os

    path = os.environ.get("RL_ENGINE_INGEST_TOKEN_FILE")
    if path and not os.environ.get("RL_ENGINE_INGEST_TOKEN"):
        try:
            with open(path, encoding="ascii") as fh:
                os.environ["RL_ENGINE_INGEST_TOKEN"] = fh.read().strip()
        except OSError as exc:
            raise ValueError(f"cannot read the ingest token file {path}: {exc.strerror}") from None


__all__ = ["JsonlSink", "MetricsSink", "MultiSink", "ProgressSink", "StdoutSink", "build_sinks"]

"""The run's sinks, built from ``logging``: the local ones, the platform's HTTP sink, and the mirrors
(MLflow, W&B; optional extras, imported lazily) whose failures the others report."""

from __future__ import annotations

from typing import Any

from rl_engine.config import ExperimentConfig, LoggingConfig
from rl_engine.sinks.base import JsonlSink, MetricsSink, MultiSink, ProgressSink, StdoutSink
from rl_engine.sinks.mirror import MirrorSink, flatten

MIRRORS = ("mlflow", "wandb")


def _mirror_factory(name: str, logging_cfg: LoggingConfig, experiment: ExperimentConfig | None) -> Any:
    """A zero-argument builder of the tracker's sink (called on the mirror's own thread)."""
    run_name = experiment.name if experiment is not None else "rl_engine"
    config = experiment.model_dump(mode="json") if experiment is not None else {}
    if name == "mlflow":

        def make() -> MetricsSink:
            from rl_engine.sinks.mlflow_sink import MlflowSink

            return MlflowSink(logging_cfg.mlflow, run_name=run_name, params=flatten(config))

        return make

    def make_wandb() -> MetricsSink:
        from rl_engine.sinks.wandb_sink import WandbSink

        return WandbSink(logging_cfg.wandb, run_name=run_name, config=config)

    return make_wandb


def build_sinks(
    logging_cfg: LoggingConfig, *, total_steps: int | None = None, experiment: ExperimentConfig | None = None
) -> MetricsSink:
    """The sinks listed in ``logging.sinks``, plus a progress bar when ``progress_bar`` is on and
    ``total_steps`` is given. ``http`` reads RL_ENGINE_INGEST_URL, RL_ENGINE_INGEST_TOKEN_FILE (or
    RL_ENGINE_INGEST_TOKEN) and RL_ENGINE_RUN_ID. Mirrors (``mlflow``, ``wandb``) get the run's name and
    config from ``experiment``; their failures are reported as alerts through the other sinks."""
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

            sinks.append(HttpSink.from_env())
    if logging_cfg.progress_bar and total_steps:
        sinks.append(ProgressSink(total_steps))
    reporters = MultiSink(list(sinks))
    # Mirrors first: at close they drain (and may still report alerts) while the other sinks are open.
    mirrors: list[MetricsSink] = [
        MirrorSink(name, _mirror_factory(name, logging_cfg, experiment), reporters.log_event)
        for name in dict.fromkeys(logging_cfg.sinks)
        if name in MIRRORS
    ]
    sinks = mirrors + sinks
    return sinks[0] if len(sinks) == 1 else MultiSink(sinks)

"""The run's sinks, built from ``logging`` and the run's placement (which adds sinks and says where their
files go): the local ones, the platform's HTTP sink, and the mirrors (MLflow, W&B; optional extras,
imported lazily) whose failures the others report."""

from __future__ import annotations

from typing import Any

from rl_engine.config import ExperimentConfig, LoggingConfig
from rl_engine.jobspec import Placement
from rl_engine.sinks.base import JsonlSink, MetricsSink, MultiSink, ProgressSink, StdoutSink
from rl_engine.sinks.mirror import MirrorSink, flatten

MIRRORS = ("mlflow", "wandb")


def _mirror_factory(
    name: str, logging_cfg: LoggingConfig, place: Placement, experiment: ExperimentConfig | None
) -> Any:
    """A zero-argument builder of the tracker's sink (called on the mirror's own thread)."""
    run_name = experiment.name if experiment is not None else "rl_engine"
    config = experiment.model_dump(mode="json") if experiment is not None else {}
    if name == "mlflow":
        uri, artifacts = place.mlflow_store(logging_cfg.mlflow.tracking_uri)

        def make() -> MetricsSink:
            from rl_engine.sinks.mlflow_sink import MlflowSink

            return MlflowSink(
                logging_cfg.mlflow,
                run_name=run_name,
                params=flatten(config),
                tracking_uri=uri,
                artifact_location=artifacts,
            )

        return make

    def make_wandb() -> MetricsSink:
        from rl_engine.sinks.wandb_sink import WandbSink

        return WandbSink(logging_cfg.wandb, run_name=run_name, config=config, folder=place.wandb_folder())

    return make_wandb


def build_sinks(
    logging_cfg: LoggingConfig,
    *,
    placement: Placement | None = None,
    total_steps: int | None = None,
    experiment: ExperimentConfig | None = None,
) -> MetricsSink:
    """The sinks listed in ``logging.sinks`` and the placement's, plus a progress bar when the placement
    has it on and ``total_steps`` is given; files go where the placement says (``rl_engine.jobspec``).
    ``http`` reads RL_ENGINE_INGEST_URL, RL_ENGINE_INGEST_TOKEN_FILE (or RL_ENGINE_INGEST_TOKEN) and
    RL_ENGINE_RUN_ID. Mirrors (``mlflow``, ``wandb``) get the run's name and config from ``experiment``;
    their failures are reported as alerts through the other sinks."""
    place = placement or Placement()
    names = place.all_sinks(logging_cfg.sinks)
    sinks: list[MetricsSink] = []
    for name in names:
        if name == "stdout":
            sinks.append(StdoutSink(every=logging_cfg.log_every))
        elif name == "jsonl":
            path = place.jsonl_file()
            if not path:
                raise ValueError(
                    "logging.sinks includes 'jsonl': the placement has no JSONL file (--jsonl-path)"
                )
            sinks.append(JsonlSink(path))
        elif name == "http":
            from rl_engine.sinks.http import HttpSink  # the platform client, only when asked for

            sinks.append(HttpSink.from_env())
    if place.progress_bar and total_steps:
        sinks.append(ProgressSink(total_steps))
    reporters = MultiSink(list(sinks))
    # Mirrors first: at close they drain (and may still report alerts) while the other sinks are open.
    mirrors: list[MetricsSink] = [
        MirrorSink(name, _mirror_factory(name, logging_cfg, place, experiment), reporters.log_event)
        for name in names
        if name in MIRRORS
    ]
    sinks = mirrors + sinks
    return sinks[0] if len(sinks) == 1 else MultiSink(sinks)

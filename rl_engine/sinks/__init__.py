"""Metrics sinks: the engine's only output channel (stdout, JSONL file, progress bar, platform HTTP) and
mirrors to the trackers a team already reads (MLflow, W&B; optional extras, imported lazily).

The interface and the local sinks are in ``base``, the run's set of sinks is built in ``build``."""

from rl_engine.sinks.base import JsonlSink, MetricsSink, MultiSink, ProgressSink, StdoutSink
from rl_engine.sinks.build import build_sinks
from rl_engine.sinks.mirror import MirrorSink

__all__ = ["JsonlSink", "MetricsSink", "MirrorSink", "MultiSink", "ProgressSink", "StdoutSink", "build_sinks"]

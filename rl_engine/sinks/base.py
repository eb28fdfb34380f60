"""The metrics sink interface and the local sinks: stdout lines, a JSONL file, a progress bar, fan-out."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from rl_engine.wire import EventKind  # what a sink's events are: log, status, alert, checkpoint

# Keys shown on a stdout line, in this order, with short labels; the JSONL file keeps everything.
_LINE_KEYS = [
    ("reward/mean", "reward"),
    ("response_length/mean", "len"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad"),
    ("actor/kl_ref", "kl"),
    ("async/staleness_mean", "stale"),
    ("timing/gen_s", "gen_s"),
    ("timing/train_s", "train_s"),
]


class MetricsSink:
    """Where the engine reports. Every method is optional for a subclass: the base ignores everything."""

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Scalar metrics of one trainer step (namespaced keys: docs/pipeline.md, "Metrics")."""

    def log_event(self, kind: EventKind, message: str, data: dict[str, Any] | None = None) -> None:
        """A log line, a status change or an alert."""

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        """Example (prompt, response, reward) records of one step."""

    def close(self) -> None:
        """Flush and release resources."""


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


class StdoutSink(MetricsSink):
    """One compact line per ``every``-th step; events as ``[kind] message``. Plays well with tqdm bars."""

    def __init__(self, every: int = 1, stream: TextIO | None = None):
        self.every = max(1, every)
        self.stream = stream

    def _write(self, line: str) -> None:
        from tqdm import tqdm

        # tqdm.write prints above an active progress bar instead of through it.
        tqdm.write(line, file=self.stream or sys.stdout)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.every:
            return
        parts = [f"{label} {_fmt(metrics[key])}" for key, label in _LINE_KEYS if key in metrics]
        if not parts:  # e.g. an evaluation's val/ metrics: its summary comes as a log event
            return
        self._write(f"step {step} | " + " | ".join(parts))

    def log_event(self, kind: EventKind, message: str, data: dict[str, Any] | None = None) -> None:
        self._write(f"[{kind}] {message}")


class JsonlSink(MetricsSink):
    """Appends one JSON object per record (``type``: metrics | event | samples) and flushes each line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()  # the pipeline may log from more than one thread

    def _write(self, record: dict[str, Any]) -> None:
        record["time"] = time.time()
        line = json.dumps(record, default=str, allow_nan=True)
        with self._lock:
            if self._fh.closed:
                return
            self._fh.write(line + "\n")
            self._fh.flush()

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._write({"type": "metrics", "step": step, "metrics": {k: float(v) for k, v in metrics.items()}})

    def log_event(self, kind: EventKind, message: str, data: dict[str, Any] | None = None) -> None:
        self._write({"type": "event", "kind": kind, "message": message, "data": data or {}})

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        self._write({"type": "samples", "step": step, "samples": samples})

    def close(self) -> None:
        with self._lock:
            self._fh.close()


class ProgressSink(MetricsSink):
    """A tqdm bar over trainer steps showing the latest mean reward (tqdm shows the step rate); shown
    only on a terminal."""

    def __init__(self, total_steps: int, stream: TextIO | None = None):
        from tqdm import tqdm

        # disable=None: no bar when the stream is not a terminal (a Ray job's log would fill with \r frames).
        self.bar = tqdm(
            total=total_steps, unit="step", file=stream or sys.stderr, dynamic_ncols=True, disable=None
        )

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if step > self.bar.n:
            self.bar.update(step - self.bar.n)
        if "reward/mean" in metrics:
            self.bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", refresh=False)

    def close(self) -> None:
        self.bar.close()


class MultiSink(MetricsSink):
    """Fans every call out to several sinks; one failing sink does not silence the others."""

    def __init__(self, sinks: list[MetricsSink]):
        self.sinks = list(sinks)

    def _each(self, method: str, *args: Any) -> None:
        errors = []
        for sink in self.sinks:
            try:
                getattr(sink, method)(*args)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._each("log_metrics", step, metrics)

    def log_event(self, kind: EventKind, message: str, data: dict[str, Any] | None = None) -> None:
        self._each("log_event", kind, message, data)

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        self._each("log_samples", step, samples)

    def close(self) -> None:
        self._each("close")

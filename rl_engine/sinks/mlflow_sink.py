"""MLflow mirror (``logging.sinks: [mlflow]``; optional extra ``mlflow-skinny``, imported only here).

One MLflow run per engine run: the config as params (flattened ``a.b.c`` keys), metrics per step in one
``log_batch`` call, example samples as an MLflow table per step (``samples/step_XXXXXXXX.json``), status
and checkpoints as tags (the checkpoint directory's model as artifacts with ``log_checkpoints``), and the
run's end state (FINISHED / KILLED when stopped / FAILED when it ended without a final status).
Always wrapped in ``MirrorSink`` by ``build_sinks``: failures become alerts, never exceptions.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from rl_engine.config import MlflowConfig
from rl_engine.sinks.base import MetricsSink
from rl_engine.wire import EventKind

_BAD_CHARS = re.compile(r"[^/\w.\- :]")
_PARAM_VALUE_MAX = 6000  # MLflow's limit; longer values (long prompts in a config) are cut


def mlflow_key(key: str) -> str:
    """A metric key MLflow accepts: ``val/pass@4`` -> ``val/pass_at_4``; other odd characters -> ``_``."""
    return _BAD_CHARS.sub("_", key.replace("@", "_at_"))


class MlflowSink(MetricsSink):
    def __init__(
        self,
        cfg: MlflowConfig,
        *,
        run_name: str,
        params: dict[str, Any],
        tracking_uri: str | None = None,
        artifact_location: str | None = None,
    ):
        """``tracking_uri`` / ``artifact_location``: where the run's placement puts the store
        (``Placement.mlflow_store``); None: MLFLOW_TRACKING_URI / the server's artifact root."""
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri) if tracking_uri else MlflowClient()
        name = cfg.experiment or run_name
        exp = self.client.get_experiment_by_name(name)
        exp_id = (
            exp.experiment_id
            if exp
            else self.client.create_experiment(name, artifact_location=artifact_location)
        )
        self.run_id = self.client.create_run(
            exp_id, run_name=cfg.run_name or run_name, tags={"rl_engine": "1"}
        ).info.run_id
        self.cfg = cfg
        items = [Param(k[:250], str(v)[:_PARAM_VALUE_MAX]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i : i + 100])
        self._end_state = "FAILED"  # until a final status event says otherwise

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(mlflow_key(k), float(v), now, int(step)) for k, v in metrics.items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i : i + 1000])

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        if not samples:
            return
        columns = sorted({k for s in samples for k in s})
        table = {"step": [step] * len(samples), **{c: [s.get(c) for s in samples] for c in columns}}
        self.client.log_table(self.run_id, data=table, artifact_file=f"samples/step_{step:08d}.json")

    def log_event(self, kind: EventKind, message: str, data: dict[str, Any] | None = None) -> None:
        data = data or {}
        if kind == EventKind.STATUS:
            self.client.set_tag(self.run_id, "rl_engine.status", message[:5000])
            if message.startswith("finished"):
                self._end_state = "FINISHED"
            elif message.startswith("stopped"):
                self._end_state = "KILLED"
        elif kind == EventKind.ALERT:
            self.client.set_tag(self.run_id, "rl_engine.last_alert", message[:5000])
        elif kind == EventKind.CHECKPOINT and data.get("path"):
            self.client.set_tag(self.run_id, "rl_engine.last_checkpoint", str(data["path"]))
            model_dir = Path(str(data["path"])) / "model"
            if self.cfg.log_checkpoints and model_dir.is_dir():
                where = f"checkpoints/step_{int(data.get('step', 0)):08d}"
                self.client.log_artifacts(self.run_id, str(model_dir), where)
                adapter = model_dir.parent / "adapter"  # model.lora: the weights that trained
                if adapter.is_dir():
                    self.client.log_artifacts(self.run_id, str(adapter), f"{where}/adapter")

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status=self._end_state)

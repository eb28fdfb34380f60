"""Weights & Biases mirror (``logging.sinks: [wandb]``; optional extra ``wandb``, imported only here).

One W&B run per engine run: the config as the run config, metrics against a ``trainer/step`` axis (W&B's
own step must only grow, but evaluation results may arrive after later training steps: with a custom
x-axis every metric lands at its own step), example samples as a ``wandb.Table`` per step, status and
the last checkpoint in the run summary, checkpoints as ``model`` artifacts with ``log_checkpoints``.
``mode: offline`` writes everything in the W&B folder the placement gives (``Placement.wandb_folder``) for a later ``wandb sync``. Always wrapped in
``MirrorSink`` by ``build_sinks``: failures become alerts, never exceptions.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rl_engine.config import WandbConfig
from rl_engine.sinks.base import MetricsSink
from rl_engine.wire import EventKind

STEP_KEY = "trainer/step"


class WandbSink(MetricsSink):
    def __init__(self, cfg: WandbConfig, *, run_name: str, config: dict[str, Any], folder: str | None = None):
        """``folder``: where W&B keeps its files (``Placement.wandb_folder``); None: ./wandb."""
        import wandb

        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=cfg.project or os.environ.get("WANDB_PROJECT") or run_name,
            entity=cfg.entity,
            mode=cfg.mode,
            dir=folder,
            name=cfg.run_name or run_name,
            tags=cfg.tags or None,
            config=config,
            reinit="create_new",  # several engine runs in one process (tests, notebooks) get their own
            settings=wandb.Settings(console="off", silent=True),
        )
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("*", step_metric=STEP_KEY)
        self.cfg = cfg
        self._exit_code = 1  # until a final status event says otherwise

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({**{k: float(v) for k, v in metrics.items()}, STEP_KEY: int(step)})

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        import wandb

        if not samples:
            return
        columns = sorted({k for s in samples for k in s})
        table = wandb.Table(
            columns=["step", *columns], data=[[step, *[s.get(c) for c in columns]] for s in samples]
        )
        self.run.log({"samples": table, STEP_KEY: int(step)})

    def log_event(self, kind: EventKind, message: str, data: dict[str, Any] | None = None) -> None:
        data = data or {}
        if kind == EventKind.STATUS:
            self.run.summary["rl_engine/status"] = message
            if message.startswith(("finished", "stopped")):
                self._exit_code = 0
        elif kind == EventKind.ALERT:
            self.run.summary["rl_engine/last_alert"] = message
        elif kind == EventKind.CHECKPOINT and data.get("path"):
            self.run.summary["rl_engine/last_checkpoint"] = str(data["path"])
            model_dir = Path(str(data["path"])) / "model"
            if self.cfg.log_checkpoints and model_dir.is_dir():
                self._log_checkpoint(model_dir, int(data.get("step", 0)))

    def _log_checkpoint(self, model_dir: Path, step: int) -> None:
        import wandb

        artifact = wandb.Artifact(f"{self.run.id}-model", type="model", metadata={"step": step})
        artifact.add_dir(str(model_dir))
        adapter = model_dir.parent / "adapter"  # model.lora: the weights that trained
        if adapter.is_dir():
            artifact.add_dir(str(adapter), name="adapter")
        self.run.log_artifact(artifact, aliases=[f"step_{step}", "latest"])

    def close(self) -> None:
        self.run.finish(exit_code=self._exit_code)

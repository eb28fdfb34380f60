"""When the driver asks for held-out evaluations, and where their ``val/`` metrics go.

Rollouter 0 evaluates (``Rollouter.evaluate``) on one of its control threads, chunk by chunk, while
its generation loop keeps producing training samples between chunks. The driver never waits for an
evaluation during training: every ``eval.every`` steps it starts one (unless the previous one is still
running: that step's is then skipped, with a ``log`` event), polls it once per step and logs its
metrics at the step it was requested for. ``eval.before_training`` and ``eval.at_end`` evaluations are
awaited like every other driver wait (watchdog, failures, stop). On a stop, the running evaluation is
cancelled at its next chunk boundary instead of awaited.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import ray

from rl_engine.config import ExperimentConfig
from rl_engine.types import EvalSummary
from rl_engine.wire import EventKind


@dataclass
class _Pending:
    step: int
    ref: Any
    started: float
    alerted: bool = False


class EvalSchedule:
    """The driver's side of evaluation: requests to rollouter 0, results to the sink."""

    def __init__(self, cfg: ExperimentConfig, rollouter: Any, sink: Any, waiter: Any) -> None:
        self.cfg, self.rollouter, self.sink, self.waiter = cfg.eval, rollouter, sink, waiter
        self.total = cfg.trainer.total_steps
        self.timeout = cfg.pipeline.watchdog_timeout_s
        self.pending: _Pending | None = None

    def final_due(self) -> bool:
        """Whether the final weights are evaluated (then the last step publishes them to the rollouters)."""
        every = self.cfg.every
        return self.cfg.at_end or bool(every and self.total % every == 0)

    def before_training(self, start_step: int) -> None:
        """The initial policy, awaited before the rollouters start (not on a resume: the run is past it)."""
        if self.cfg.before_training and start_step == 0:
            self._evaluate_now(0, 0)

    def after_step(self, step: int, version: int) -> None:
        """Poll the running evaluation; start the one due at ``step`` on weights ``version`` (the last sync)."""
        self.poll()
        every = self.cfg.every
        if not every or step % every or step >= self.total:  # the last step's is ``finish``'s
            return
        if self.pending is not None:
            self.sink.log_event(
                EventKind.LOG,
                f"evaluation at step {step} skipped: the one requested at step {self.pending.step} is "
                "still running",
                {"step": step, "running_since_step": self.pending.step},
            )
            return
        self.pending = _Pending(step, self.rollouter.evaluate.remote(step, version), time.monotonic())

    def poll(self) -> None:
        p = self.pending
        if p is None:
            return
        ready, _ = ray.wait([p.ref], timeout=0)
        if ready:
            self.pending = None
            self._log(p.step, self.waiter.get(p.ref, "evaluation"))
            return
        running = time.monotonic() - p.started
        if running > self.timeout and not p.alerted:
            p.alerted = True
            self.sink.log_event(
                EventKind.ALERT,
                f"watchdog: the evaluation requested at step {p.step} has run for {running:.1f} s",
                {"stage": "evaluation", "timeout_s": self.timeout, "step": p.step},
            )

    def finish(self, step: int, version: int, stopping: bool) -> None:
        """End of the run: await the running evaluation and evaluate the final weights; when stopping,
        log the running one only if it is already done, else cancel it."""
        if stopping:
            self.poll()
            if self.pending is not None:
                self.rollouter.cancel_evaluation.remote()
                self.sink.log_event(
                    EventKind.LOG,
                    f"evaluation requested at step {self.pending.step} cancelled: the run is stopping",
                    {"step": self.pending.step},
                )
                self.pending = None
            return
        if self.pending is not None:
            p = self.pending
            self._log(p.step, self.waiter.wait_one(p.ref, "evaluation"))
            self.pending = None
        if self.final_due():
            self._evaluate_now(step, version)

    def _evaluate_now(self, step: int, version: int) -> None:
        self._log(step, self.waiter.wait_one(self.rollouter.evaluate.remote(step, version), "evaluation"))

    def _log(self, step: int, summary: EvalSummary | None) -> None:
        if summary is None:  # cancelled by a stop
            return
        self.sink.log_metrics(step, summary.metrics())
        self.sink.log_event(
            EventKind.LOG,
            f"evaluation at step {step}: reward {summary.reward_mean:.4g}, pass@1 {summary.pass_at_1:.4g}, "
            f"length {summary.response_length:.4g} ({summary.num_prompts} prompts, {summary.time_s:.1f} s)",
            {"step": step},
        )

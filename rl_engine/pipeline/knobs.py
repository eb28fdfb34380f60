"""The three modes as knobs of one pipeline, and the staleness arithmetic (pure Python, no Ray).

Definitions (see docs/pipeline.md for the worked derivation):

* A sample's **staleness** = trainer version when the sample is consumed - ``param_version_start``.
  The trainer version is the number of trainer steps already applied; it is the version of the
  weights the step starts from.
* With weights pushed every ``T = trigger_parameter_sync_step`` steps, rollouters only ever hold
  versions that are multiples of T (or the resumed version), so a lag of up to ``T - 1`` is
  unavoidable. ``staleness_threshold = B`` allows B *further* sync windows of lag::

      max_staleness = (B + 1) * T - 1          # T = 1: max_staleness = B

* **Admission** (enforced before generation starts, in the MessageQueue): a rollouter holding
  weights of version ``v`` may start ``k`` more samples only if
  ``admitted - dropped + k <= (v + max_staleness + 1) * batch_size``: samples are consumed in
  admission order, ``batch_size`` per step, so the j-th admitted sample (0-based, not counting
  drops) is consumed at step ``j // batch_size`` <= ``v + max_staleness``.
* **Consumption check** (enforced by the MessageQueue when the trainer takes a batch): a group
  whose staleness would exceed ``max_staleness`` (possible with several rollouters or long partial
  rollouts, whose order of completion differs from admission order) is dropped, counted in
  ``async/dropped_stale``, and its admission slot is released so a fresh group replaces it.

Mode → knobs: ``sync`` is B = 0, T = 1 (generation of batch k waits for weights k, training waits
for batch k: nothing overlaps); ``one_step_off`` is B = 1, T = 1 without partial rollout (batch k+1
is generated on weights k while step k trains); ``fully_async`` takes B, T and ``partial_rollout``
from the config. With B = 0 and T = 1, ``fully_async`` is therefore the very same schedule as ``sync``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rl_engine.config import ExperimentConfig
from rl_engine.types import Sample


class StalenessViolation(RuntimeError):
    """A batch reached the trainer with a sample older than the staleness bound (a pipeline bug: the
    queue drops such samples). Raised before training, so the batch is never trained on."""


@dataclass(frozen=True)
class Knobs:
    """What the single pipeline code path needs to know about the mode."""

    mode: str
    staleness_threshold: int  # B
    trigger: int  # T
    partial_rollout: bool
    require_batches: int
    batch_size: int  # samples per trainer step
    group_size: int  # rollout.n
    prompts_per_call: int  # prompts per worker.generate call

    @property
    def max_staleness(self) -> int:
        """Largest trainer-version lag a trained sample may have: (B + 1) * T - 1."""
        return (self.staleness_threshold + 1) * self.trigger - 1

    def admission_capacity(self, rollout_version: int) -> int:
        """Samples that may have been admitted (net of drops) while rollouters hold ``rollout_version``."""
        return (rollout_version + self.max_staleness + 1) * self.batch_size

    def is_stale(self, trainer_version: int, param_version_start: int) -> bool:
        return trainer_version - param_version_start > self.max_staleness

    def batch_staleness(self, trainer_version: int, batch: Sequence[Sample]) -> list[int]:
        """Staleness of each sample of a batch about to be trained at ``trainer_version``; raises
        ``StalenessViolation`` naming the first sample over the bound."""
        stal = [trainer_version - s.param_version_start for s in batch]
        for i, (s, lag) in enumerate(zip(batch, stal, strict=True)):
            if lag > self.max_staleness:
                raise StalenessViolation(
                    f"sample {s.group_id}/{i % self.group_size} was generated from version "
                    f"{s.param_version_start} and reached the trainer at version {trainer_version}: "
                    f"staleness {lag} > max_staleness {self.max_staleness} ({self.mode}); not trained"
                )
        return stal


def knobs_from_config(cfg: ExperimentConfig) -> Knobs:
    """Translate ``pipeline.mode`` into knobs; the one place where modes differ. (That the queue bound
    fits a generate call and a trainer pull is the config's own check: ExperimentConfig._queue_fits.)"""
    p = cfg.pipeline
    if p.mode == "sync":
        b, t, partial = 0, 1, False
    elif p.mode == "one_step_off":
        b, t, partial = 1, 1, False
    else:
        b, t, partial = p.staleness_threshold, p.trigger_parameter_sync_step, p.partial_rollout
    return Knobs(
        mode=p.mode,
        staleness_threshold=b,
        trigger=t,
        partial_rollout=partial,
        require_batches=p.require_batches,
        batch_size=cfg.trainer.batch_size,
        group_size=cfg.rollout.n,
        prompts_per_call=cfg.prompts_per_call(),
    )

"""How long a graceful stop of this run needs, as the driver reports it to whoever may stop it.

A stop (SIGTERM from a Ray Job stop or a platform cancel) goes: the trainer leaves its step at the next
micro-batch before the first optimizer update, or finishes the step's uninterruptible tail (clip, AdamW,
LR step); a weight sync in flight completes; a running evaluation ends at its next chunk; the last
completed step is checkpointed; the actors are torn down. ``StopGrace`` adds up what was measured of
those (the longest stretch between two stop points of a trainer step, the tail, the last weight sync,
the last checkpoint's write) with a safety factor, and a fixed margin for the evaluation chunk and the
teardown. Before a checkpoint has been written its time is estimated from the bytes it will hold
(``trainer state bytes / CHECKPOINT_WRITE_BYTES_PER_S``).

The driver sends the figure as a ``status`` event whose data holds ``stop_grace_s``
(``rl_engine.wire.StopGraceData``) when it is first known and whenever it moves by more than a quarter:
the platform waits that long after SIGTERM before it calls a cancel overdue (bounded by its operator's
maximum, ``RUN_CANCEL_GRACE_MAX_S``).
"""

from __future__ import annotations

from dataclasses import dataclass

SAFETY = 2.0  # measured stretches vary with the machine's load: twice what was seen
MARGIN_S = 15.0  # an evaluation's chunk, the actors' teardown, Ray's job bookkeeping
# A conservative disk write rate for the first checkpoint's estimate (measured here: a 1.6 GB checkpoint
# of SmolLM2-135M wrote at 200-400 MB/s on an idle disk; docs/engine.md, "Stopping").
CHECKPOINT_WRITE_BYTES_PER_S = 100 * 2**20
REPORT_CHANGE = 0.25  # report again when the figure moves by more than this fraction


@dataclass
class StopGrace:
    """The running estimate; ``update`` returns the figure to report, or None when nothing moved."""

    state_bytes: int = 0  # what a checkpoint holds (model, optimizer state)
    longest_gap_s: float = 0.0
    tail_s: float = 0.0
    sync_s: float = 0.0
    checkpoint_s: float | None = None  # the last checkpoint's write, once one was written
    reported: float | None = None

    def need_s(self) -> float:
        ckpt = (
            self.checkpoint_s
            if self.checkpoint_s is not None
            else self.state_bytes / CHECKPOINT_WRITE_BYTES_PER_S
        )
        return MARGIN_S + SAFETY * (self.longest_gap_s + self.tail_s + self.sync_s + ckpt)

    def update(self) -> float | None:
        need = round(self.need_s(), 1)
        if self.reported is not None and abs(need - self.reported) <= REPORT_CHANGE * self.reported:
            return None
        self.reported = need
        return need

"""MessageQueue: the bounded, versioned buffer of scored sample groups between rollouters and trainer.

Run as an *async* Ray actor so that a trainer waiting for a batch never blocks rollouters putting
groups (every method is a coroutine on one event loop: no locks needed). It also owns the global
admission counter that bounds staleness before generation starts (``knobs.Knobs``), and it never
drops silently: a group that would exceed the staleness bound is counted in ``dropped_stale`` and
its uids are kept for the run summary.

All counts are in *samples* (responses). Conservation, checked by tests::

    admitted == consumed + queued + dropped_stale + in_flight(rollouters)
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import replace

from rl_engine.pipeline.knobs import Knobs
from rl_engine.types import QueueBatch, QueueCounters, QueueSnapshot, QueueStats, Sample, split_groups


class PipelineFailure(RuntimeError):
    """Raised to every waiter once a pipeline actor reported a fatal error."""


class MessageQueue:
    """Bounded FIFO of sample groups. Bound = the admission capacity (staleness) or ``max_size``."""

    def __init__(self, knobs: Knobs, max_size: int = 0) -> None:
        self.knobs = knobs
        self.max_size = max_size  # samples queued or being generated; 0 = only the staleness bound
        self._groups: collections.deque[list[Sample]] = collections.deque()
        self._queued = 0
        self.c = QueueCounters()
        self._dropped_uids: list[str] = []  # for the run summary (not checkpointed)
        self._changed = asyncio.Condition()
        self._failure: str | None = None
        self._closed = False
        self._max_depth = 0

    # --- admission (rollouters, before generating) ---------------------------------------------------
    async def try_admit(self, num_samples: int, rollout_version: int) -> bool:
        """Grant ``num_samples`` generation slots to a rollouter holding ``rollout_version``."""
        self._raise_if_failed()
        if self._closed:
            return False
        net = self.c.admitted - self.c.dropped_stale + num_samples
        if net > self.knobs.admission_capacity(rollout_version):
            return False
        # queued + in flight (admitted, not consumed, not dropped): counting what is still being
        # generated keeps ``max_size`` a hard bound on the queue with several producers
        outstanding = self.c.admitted - self.c.consumed - self.c.dropped_stale
        if self.max_size and outstanding + num_samples > self.max_size:
            return False
        self.c.admitted += num_samples
        return True

    # --- producer side ------------------------------------------------------------------------------
    async def put(self, group: list[Sample]) -> int:
        """Append one scored group (all samples of one prompt); returns the depth in samples."""
        return await self.put_many([group])

    async def put_many(self, groups: list[list[Sample]]) -> int:
        """Append several groups at once (one actor call per generate call); returns the depth in samples."""
        self._raise_if_failed()
        for group in groups:
            self._groups.append(group)
            self._queued += len(group)
            self.c.generated += len(group)
        self._max_depth = max(self._max_depth, self._queued)
        async with self._changed:
            self._changed.notify_all()
        return self._queued

    async def report_dropped(self, uids: list[str]) -> None:
        """A rollouter discarded in-flight samples that could no longer meet the staleness bound."""
        self.c.dropped_stale += len(uids)
        self._dropped_uids.extend(uids)

    # --- consumer side ------------------------------------------------------------------------------
    async def get(self, num_samples: int, trainer_version: int, timeout_s: float) -> QueueBatch | None:
        """Take ``num_samples`` samples (whole groups, FIFO) for a step at ``trainer_version``.

        Groups that are too stale for this version are dropped (counted) on the way. None when nothing
        complete arrived within ``timeout_s`` (and nothing was dropped).
        """
        dropped = 0
        deadline = asyncio.get_running_loop().time() + timeout_s
        async with self._changed:
            while True:
                self._raise_if_failed()
                dropped += self._drop_stale_head(trainer_version)
                if self._queued >= num_samples or self._closed:
                    break
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return QueueBatch([], dropped) if dropped else None
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except TimeoutError:
                    continue
        out: list[Sample] = []
        while self._groups and len(out) < num_samples:
            group = self._groups.popleft()
            self._queued -= len(group)
            out.extend(group)
        self.c.consumed += len(out)
        return QueueBatch(out, dropped)

    async def unget(self, samples: list[Sample]) -> None:
        """Return samples taken for a step that was cancelled to the front, in their order."""
        for g in reversed(split_groups(samples)):
            self._groups.appendleft(g)
            self._queued += len(g)
        self.c.consumed -= len(samples)

    def _drop_stale_head(self, trainer_version: int) -> int:
        """Drop every queued group too stale for ``trainer_version`` (keeps FIFO order of the rest)."""
        keep: collections.deque[list[Sample]] = collections.deque()
        dropped = 0
        for group in self._groups:
            if self.knobs.is_stale(trainer_version, min(s.param_version_start for s in group)):
                dropped += len(group)
                self._dropped_uids.extend(f"{s.group_id}/{i}" for i, s in enumerate(group))
            else:
                keep.append(group)
        if dropped:
            self._groups = keep
            self._queued -= dropped
            self.c.dropped_stale += dropped
        return dropped

    # --- failure / lifecycle ------------------------------------------------------------------------
    async def fail(self, message: str) -> None:
        """Record the first fatal error of any actor and wake every waiter so it can raise it."""
        if self._failure is None:
            self._failure = message
        async with self._changed:
            self._changed.notify_all()

    async def close(self) -> None:
        self._closed = True
        async with self._changed:
            self._changed.notify_all()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise PipelineFailure(self._failure)

    # --- observation / checkpoint -------------------------------------------------------------------
    async def stats(self) -> QueueStats:
        c = self.c
        return QueueStats(
            queued=self._queued,
            max_depth=self._max_depth,
            admitted=c.admitted,
            generated=c.generated,
            consumed=c.consumed,
            dropped_stale=c.dropped_stale,
            failure=self._failure,
        )

    async def dropped_uids(self) -> list[str]:
        return list(self._dropped_uids)

    async def snapshot(self) -> QueueSnapshot:
        """Queued groups and counters, for a checkpoint (the queue keeps its content)."""
        return QueueSnapshot([list(g) for g in self._groups], replace(self.c))

    async def restore(self, state: QueueSnapshot) -> None:
        """Put checkpointed groups back and continue the counters (no sample is counted twice)."""
        self.c = replace(state.counters)
        for group in state.groups:
            self._groups.append(list(group))
            self._queued += len(group)
        self._max_depth = max(self._max_depth, self._queued)
        async with self._changed:
            self._changed.notify_all()

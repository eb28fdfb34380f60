"""Which of a run's stored metric points one live follower has received: by batch, not by point.

Every metrics ingest of a run stores its points under a per-run lock (``services.metrics_ingest``) and
advances the run's point counter (``RunProgress.points``) in the same transaction. So a run's batches
are numbered by that counter without gaps or overlaps, in commit order, and a batch's rows hold the
run's ids from its first to its last, no other (ids are taken under the lock). A batch is a ``Span``:
the counter before and after it, and its first and last ids. Each live metrics message names the spans
it carries (in its envelope's header: ``tracking.bus.Envelope.spans``).

A follower's ``Coverage`` starts at the counter read when it connected and moves forward over every span
that arrives live. Its poll then reads one row (the counter and the last id, ``RunProgress``) and
compares: equal means nothing was missed, whatever the number of points, where the poll used to read
back every point and the follower used to remember every (key, step) it was sent. Behind means
a batch is in flight or was lost; the poll reads exactly the rows between the covered prefix and the
counter, minus the id ranges of spans that came live beyond the gap.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

AHEAD_MAX = 10_000  # spans remembered beyond a gap until a poll fills it (then only duplicates risk)


@dataclass(frozen=True)
class Span:
    """One stored batch of a run: counter values ``start`` < ``end`` (``end - start`` points) and its
    rows' ids, ``first_id`` ≤ ``last_id``."""

    start: int
    end: int
    first_id: int
    last_id: int

    def as_list(self) -> list[int]:
        return [self.start, self.end, self.first_id, self.last_id]


@dataclass(frozen=True)
class Stored:
    """A run's counter and the id of its last stored point, read together (one row, one snapshot)."""

    count: int
    last_id: int


class Coverage:
    """The received prefix ``[.., count)`` of a run's batches (``last_id``: its last row's id) and the
    spans received beyond it. Not thread-safe: the consumer holds its lock."""

    def __init__(self, stored: Stored) -> None:
        self.count = stored.count
        self.last_id = stored.last_id
        self.ahead: dict[int, Span] = {}  # start -> span, for spans beyond a gap

    def add(self, span: Span) -> None:
        """A span arrived live."""
        if span.end <= self.count:
            return  # covered already (committed before the follower's snapshot, or a poll sent it)
        if span.start > self.count:
            if len(self.ahead) >= AHEAD_MAX:  # a gap no poll fills (polling off): stop growing
                self.ahead.clear()
            self.ahead[span.start] = span
            return
        self.count, self.last_id = span.end, span.last_id
        self._absorb()

    def behind(self, stored: Stored) -> bool:
        """Points ``stored`` counts that did not arrive (yet)."""
        return self.count < stored.count

    def missed(self, ids: list[int], upto: Stored) -> list[int]:
        """Of ``ids`` (the run's rows up to ``upto.last_id``, ascending), those neither in the received
        prefix (which may have grown since they were read) nor in a span received beyond it: the rows
        to send."""
        ranges = sorted((s.first_id, s.last_id) for s in self.ahead.values() if s.start < upto.count)
        firsts = [r[0] for r in ranges]
        out = []
        for i in ids:
            if i <= self.last_id:
                continue
            k = bisect.bisect_right(firsts, i) - 1
            if k < 0 or i > ranges[k][1]:
                out.append(i)
        return out

    def filled(self, upto: Stored) -> None:
        """Everything up to ``upto`` was sent (a poll read it): move the prefix there."""
        if upto.count > self.count:
            self.count, self.last_id = upto.count, upto.last_id
            self.ahead = {s.start: s for s in self.ahead.values() if s.end > self.count}
            self._absorb()

    def _absorb(self) -> None:
        while (nxt := self.ahead.pop(self.count, None)) is not None:
            self.count, self.last_id = nxt.end, nxt.last_id

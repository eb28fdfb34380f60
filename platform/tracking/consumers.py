"""The live stream of one run: ``ws/runs/<id>/``.

Protocol (docs/dashboard.md has the full picture):

- Connect as a logged-in member of the run's project (session cookie, or an API token:
  ``tracking/ws_auth.py``); anyone else is refused at the handshake. ``?last_seq=N`` in the URL (or a later ``{"type": "resume", "last_seq": N}`` message) says
  which events the client already has.
- The server first sends ``{"kind": "hello", "run": {...}}``, then every stored event with ``seq > N``
  from the database (catch-up), then live messages as ``tracking.live`` publishes them after commit:
  ``{"kind": "event", "event": {seq, kind, message, data, created}}`` and
  ``{"kind": "metrics", "series": {key: {steps, values, wall_times}}}``. Every message is described,
  and built, in ``rl_engine.wire`` (``LiveMessage`` and its builders).
- Events are sent in ``seq`` order without gaps or repeats: a published event that skips ahead makes the
  consumer read the gap from the database first.
- Database poll: every ``LIVE_POLL_INTERVAL_S`` the consumer also checks the database for metric points
  and events the live bus did not carry. For metrics it reads one row, the run's batch counter
  (tracking/coverage.py), and compares it with the batches that arrived live; it reads points only when
  a batch is still missing one poll later (or at once while the bus is down). The embedded default's
  in-process bus cannot carry a message from a Celery worker (status changes) to the web process, so
  there it polls every 1.5 s. With Redis the bus carries everything and the poll (10 s) is a safety net.
- Live messages reach the consumer through its process's ``LiveHub`` (tracking/hub.py): one bus
  subscription per run and process, each message received once; its JSON text was encoded once, by the
  publisher, for every follower. The consumer reads its inbox in a task of its own; Channels' channel
  layer is not used.
- A live bus that is unreachable (Redis down) does not end the stream: the consumer polls the database
  every ``FALLBACK_POLL_S`` meanwhile; the hub retries the bus with a backoff, and once it answers
  listens to the runs again and tells each consumer to read what it missed.
- Membership and the session (for a token stream: the token) are re-checked on every poll, at least
  every ``MEMBERSHIP_RECHECK_S`` and on every client message (``tracking/stream_access.py``: one
  statement while the rows Django's check read are unchanged): a user removed from the project (or
  deactivated), logged out, or whose password changed since the stream opened is disconnected with
  code 4403.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import connection

from experiments.models import Run
from experiments.summary import run_summary
from rl_engine import wire
from tracking import stream_access
from tracking.bus import Envelope, live_bus
from tracking.coverage import Coverage, Stored
from tracking.hub import Inbox, LiveHub, Resync, hub_for
from tracking.models import MetricPoint, RunEvent, RunProgress
from tracking.services import event_payload

log = logging.getLogger(__name__)

CATCH_UP_BATCH = 500  # events per database read while catching up
POLL_METRIC_ROWS = 5000  # metric points per database read of a poll
CLOSE_FORBIDDEN = 4403
MEMBERSHIP_RECHECK_S = 5.0  # longest time between two membership checks of an open stream
FALLBACK_POLL_S = 1.5  # database poll period while the live bus is unreachable


def poll_interval_s() -> float:
    """The configured poll period (0: no poll while the bus works)."""
    return float(getattr(settings, "LIVE_POLL_INTERVAL_S", 1.5))


# --- database reads (sync; wrapped below) -------------------------------------------------------------


def _run_summary(run_id: int) -> dict[str, Any]:
    return run_summary(Run.objects.select_related("experiment", "project").get(pk=run_id))


def _events_after(run_id: int, seq: int, limit: int = CATCH_UP_BATCH) -> list[wire.EventMessage]:
    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=seq).order_by("seq")[:limit]
    return [event_payload(e) for e in rows]


def _stored_at_connect(run_id: int) -> Stored:
    """The run's batch counter and last point id, one snapshot. A run whose points predate the counter
    (no ``last_point_id`` yet) starts from its highest point id."""
    progress, points = RunProgress._meta.db_table, MetricPoint._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT coalesce((SELECT points FROM {progress} WHERE run_id = %s), 0), "
            f"coalesce((SELECT last_point_id FROM {progress} WHERE run_id = %s), "
            f"(SELECT max(id) FROM {points} WHERE run_id = %s), 0)",
            [run_id, run_id, run_id],
        )
        count, last_id = cur.fetchone()
    return Stored(count=int(count), last_id=int(last_id))


def _stored_now(run_id: int) -> Stored | None:
    """The run's batch counter and last point id (one row), None before its first batch."""
    row = RunProgress.objects.filter(run_id=run_id).values_list("points", "last_point_id").first()
    if row is None or row[1] is None:
        return None
    return Stored(count=row[0], last_id=row[1])


def _point_ids_between(run_id: int, after: int, upto: int) -> list[int]:
    """Ids of the run's points with ``after`` < id ≤ ``upto``, ascending, at most POLL_METRIC_ROWS."""
    rows = MetricPoint.objects.filter(run_id=run_id, id__gt=after, id__lte=upto).order_by("id")
    return list(rows.values_list("id", flat=True)[:POLL_METRIC_ROWS])


def _metric_rows(ids: list[int]) -> list[wire.MetricRow]:
    """The metric points with these ids, in id order."""
    rows = (
        MetricPoint.objects.filter(id__in=ids).order_by("id").values_list("key", "step", "value", "wall_time")
    )
    return list(rows)


def _access(consumer: RunConsumer) -> bool:
    """``stream_access``: the recorded rows when the stream has them and they hold, else Django's check."""
    scope = consumer.scope
    user, session = scope.get("user"), scope.get("session")
    by_token = scope.get("auth") is not None  # set by tracking/ws_auth.py for a token handshake
    grant = consumer.grant
    if grant is not None and stream_access.still_granted(
        grant, user, consumer.run_id, session, by_token=by_token
    ):
        return True
    ok, consumer.grant = stream_access.check(user, consumer.run_id, session, by_token=by_token)
    return ok


access = database_sync_to_async(_access)
summary_of = database_sync_to_async(_run_summary)
events_after = database_sync_to_async(_events_after)
stored_at_connect = database_sync_to_async(_stored_at_connect)
stored_now = database_sync_to_async(_stored_now)
point_ids_between = database_sync_to_async(_point_ids_between)
metric_rows = database_sync_to_async(_metric_rows)


class RunConsumer(AsyncJsonWebsocketConsumer):
    """Forwards one run's events (in seq order, caught up from the DB) and metric batches."""

    run_id: int
    hub: LiveHub

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inbox = Inbox()  # live messages, from the process's hub
        self.subscribed = False
        self.member_checked = time.monotonic()  # when membership was last confirmed
        self.grant: stream_access.Grant | None = None  # what the last passed check read
        self.poller: asyncio.Task[None] | None = None
        self.reader: asyncio.Task[None] | None = None  # takes the inbox's messages, once accepted

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        self.last_seq = 0
        # The run's stored batches this socket was sent (from connect on); set once accepted.
        self.coverage = Coverage(Stored(count=0, last_id=0))
        self.owed: int | None = None  # the batch counter a poll found ahead of the coverage, if any
        self.lock = asyncio.Lock()  # what was sent: last_seq, coverage
        self.events_read_lock = asyncio.Lock()
        self.metrics_read_lock = asyncio.Lock()
        self.hub = hub_for(live_bus())
        if not await self.still_member():  # before accept: the handshake is refused
            return
        self.subscribed = True
        if not await self.hub.subscribe(self.run_id, self.inbox):  # the poll carries the stream meanwhile
            log.warning("run %s: live bus unreachable; following the database", self.run_id)
        await self.accept()
        # Metrics stored before now come from the REST history the page loads; the poll takes it from here.
        self.coverage = Coverage(await stored_at_connect(self.run_id))
        await self.send_json(wire.live_hello(await summary_of(self.run_id)))
        await self.catch_up(_query_int(self.scope, "last_seq"))
        # Live messages that came meanwhile wait in the inbox: they follow the hello and the catch-up.
        self.reader = asyncio.create_task(self.read_inbox(), name=f"live-follower-{self.run_id}")
        self.poller = asyncio.create_task(self.poll_forever(), name=f"live-poll-{self.run_id}")

    async def disconnect(self, code: int) -> None:
        for task in (self.poller, self.reader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.subscribed:
            self.subscribed = False
            await self.hub.unsubscribe(self.run_id, self.inbox)

    async def read_inbox(self) -> None:
        """Send what the hub delivers, in order. Not through Channels' dispatch, which would run
        ``close_old_connections`` before each message on the one thread every consumer of the process
        shares for its database reads: under load (100 followers) live messages then queued behind other
        consumers' polls for tens of seconds (docs/benchmarks.md). The handlers reach the database only
        through ``database_sync_to_async``, which closes stale connections itself."""
        while True:
            item = await self.inbox.get()
            try:
                if isinstance(item, Resync):
                    await self.live_resync()
                else:
                    await self.run_update(item)
            except asyncio.CancelledError:
                raise
            except Exception:  # one failed message must not end the stream: the poll covers it
                log.warning("live message to a follower of run %s failed", self.run_id, exc_info=True)

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        """Text frames holding JSON only; anything else gets an error message, not a dropped connection."""
        try:
            content = json.loads(text_data) if text_data is not None else None
        except ValueError:
            content = None
        if content is None:
            await self.send_json(wire.live_error("messages must be JSON text"))
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """``{"type": "resume", "last_seq": N}``: send again every event after N (e.g. after a gap)."""
        if not await self.still_member():
            return
        if not isinstance(content, dict) or content.get("type") != "resume":
            await self.send_json(wire.live_error('expected {"type": "resume", "last_seq": <int>}'))
            return
        seq = content.get("last_seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            await self.send_json(wire.live_error("last_seq must be a non-negative integer"))
            return
        await self.catch_up(seq)

    # --- live messages (tracking.live.publish) ----------------------------------------------------------

    async def run_update(self, envelope: Envelope) -> None:
        """A live message; ``envelope.text`` is its payload as JSON, encoded once by the publisher."""
        if envelope.kind == wire.LiveKind.EVENT:
            async with self.lock:
                if envelope.seq <= self.last_seq:
                    return  # already sent (by the catch-up or the poll)
                if envelope.seq == self.last_seq + 1:
                    await self.send(text_data=envelope.text)
                    self.last_seq = envelope.seq
                    return
            await self.catch_up()  # it skipped ahead: the gap is in the database
        elif envelope.kind == wire.LiveKind.METRICS:
            async with self.lock:
                for span in envelope.spans:
                    self.coverage.add(span)
                await self.send(text_data=envelope.text)
        else:
            await self.send(text_data=envelope.text)

    async def live_resync(self) -> None:
        """The hub reached the bus again after losing it: read what it did not carry meanwhile."""
        await self._poll_quietly(now=True)

    # --- database reads --------------------------------------------------------------------------------

    # The database reads below run on one thread shared by every consumer of the process (Channels'
    # thread-sensitive executor), so under load a read waits behind others' reads. They are made outside
    # ``self.lock``: holding it across a read would hold back this consumer's live messages meanwhile.
    # ``events_read_lock`` and ``metrics_read_lock`` keep one catch-up and one metrics poll at a time
    # (each advances its own cursor).

    async def catch_up(self, from_seq: int | None = None) -> None:
        """Send every stored event after ``from_seq`` (default: the last one sent), in order."""
        async with self.events_read_lock:
            if from_seq is not None:
                async with self.lock:
                    self.last_seq = from_seq
            while True:
                batch = await events_after(self.run_id, self.last_seq)
                async with self.lock:
                    for payload in batch:
                        seq = payload["event"]["seq"]
                        if seq > self.last_seq:  # (not sent live while the batch was read)
                            await self.send_json(payload)
                            self.last_seq = seq
                if len(batch) < CATCH_UP_BATCH:
                    return

    async def poll_once(self, *, now: bool = False) -> None:
        """Send the metric points the layer did not carry, then the events after the last one sent.
        Metrics first: a run's last points come before the status event that ends it.

        A batch the run's counter has but the coverage does not is missed only if it is still missing
        at the next poll (a live message may be on its way), or at once (``now``) when the layer was
        away. Its points are read page after page of POLL_METRIC_ROWS until caught up."""
        async with self.metrics_read_lock:
            stored = await stored_now(self.run_id)
            async with self.lock:
                behind = stored is not None and self.coverage.behind(stored)
                due = behind and (now or (self.owed is not None and self.coverage.count < self.owed))
                self.owed = stored.count if behind and not due else None
                after = self.coverage.last_id
            if due and stored is not None:
                await self._send_missed(after, stored)
        await self.catch_up()

    async def _send_missed(self, after: int, upto: Stored) -> None:
        """Send the points with ids in (``after``, ``upto.last_id``] that no live span carried."""
        while True:
            ids = await point_ids_between(self.run_id, after, upto.last_id)
            async with self.lock:
                missed = self.coverage.missed(ids, upto)
            if missed:
                rows = await metric_rows(missed)
                async with self.lock:
                    await self.send_json(wire.live_metrics(rows, source="poll"))
            if len(ids) < POLL_METRIC_ROWS:
                break
            after = ids[-1]
        async with self.lock:
            self.coverage.filled(upto)

    async def still_member(self) -> bool:
        """Re-check that the user may still see the run; if not, close the socket with 4403."""
        self.member_checked = time.monotonic()
        if await access(self):
            return True
        log.info("closing the live stream of run %s: the user is not (or no longer) a member", self.run_id)
        await self.close(code=CLOSE_FORBIDDEN)
        return False

    async def poll_forever(self) -> None:
        """Poll every LIVE_POLL_INTERVAL_S, and every FALLBACK_POLL_S while the layer is unreachable."""
        last = time.monotonic()
        while True:
            configured = poll_interval_s()
            await asyncio.sleep(min(configured, FALLBACK_POLL_S) if configured > 0 else FALLBACK_POLL_S)
            now = time.monotonic()
            due = configured > 0 and now - last >= configured
            if (
                due or now - self.member_checked >= MEMBERSHIP_RECHECK_S
            ) and not await self._still_member_quietly():
                return
            if self.hub.up and not due:
                continue
            last = time.monotonic()
            await self._poll_quietly(now=not self.hub.up)

    async def _still_member_quietly(self) -> bool:
        """``still_member``; a failed check (DB hiccup) keeps the stream open until the next one."""
        try:
            return await self.still_member()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("membership re-check of run %s failed", self.run_id, exc_info=True)
            return True

    async def _poll_quietly(self, *, now: bool = False) -> None:
        try:
            await self.poll_once(now=now)
        except asyncio.CancelledError:
            raise
        except Exception:  # a failed poll (DB hiccup) must not end the stream; the next one retries
            log.warning("live poll of run %s failed", self.run_id, exc_info=True)


def _query_int(scope: dict[str, Any], name: str) -> int:
    """An integer query-string parameter, 0 when absent or malformed."""
    from urllib.parse import parse_qs

    raw = parse_qs((scope.get("query_string") or b"").decode("latin-1")).get(name, ["0"])[0]
    try:
        return max(int(raw), 0)
    except ValueError:
        return 0

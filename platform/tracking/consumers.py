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
  code 4403. A run id that is not one (not ASCII digits, or past a bigint) is refused like an unknown run.
- Bounds on what one viewer can make the process do: at most ``LIVE_MAX_SOCKETS_PER_USER_RUN`` open
  streams of a run per user and process (one more is refused at the handshake with code 4429); client
  messages are rate-limited per socket (``LIVE_CLIENT_MESSAGE_BURST`` at once, then one every
  ``LIVE_CLIENT_MESSAGE_REFILL_S``; beyond, an error message and nothing else); and a socket has at
  most one resume's catch-up in flight: a resume that arrives meanwhile joins it (or, asking for older
  events, is read once after it). Twenty resumes from 0 once cost twenty full catch-ups.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from collections import Counter
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import connection

from accounts.ids import MAX_DB_ID, parse_ascii_int, parse_db_id
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
CLOSE_TOO_MANY = 4429  # this user has LIVE_MAX_SOCKETS_PER_USER_RUN streams of the run open already
MAX_SOCKETS_PER_USER_RUN = 8  # defaults of the settings read below
CLIENT_MESSAGE_BURST = 4
CLIENT_MESSAGE_REFILL_S = 2.0
MEMBERSHIP_RECHECK_S = 5.0  # longest time between two membership checks of an open stream
FALLBACK_POLL_S = 1.5  # database poll period while the live bus is unreachable


def poll_interval_s() -> float:
    """The configured poll period (0: no poll while the bus works)."""
    return float(getattr(settings, "LIVE_POLL_INTERVAL_S", 1.5))


def max_sockets_per_user_run() -> int:
    return int(getattr(settings, "LIVE_MAX_SOCKETS_PER_USER_RUN", MAX_SOCKETS_PER_USER_RUN))


def client_message_rate() -> tuple[float, float]:
    """(burst, refill period in s) of a socket's client messages."""
    burst = float(getattr(settings, "LIVE_CLIENT_MESSAGE_BURST", CLIENT_MESSAGE_BURST))
    return burst, float(getattr(settings, "LIVE_CLIENT_MESSAGE_REFILL_S", CLIENT_MESSAGE_REFILL_S))


# Open streams per (user, run) on each event loop (a process serves its sockets on one loop).
_open_streams: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Counter[tuple[int, int]]] = (
    weakref.WeakKeyDictionary()
)


def _streams_here() -> Counter[tuple[int, int]]:
    return _open_streams.setdefault(asyncio.get_running_loop(), Counter())


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
        self.resumer: asyncio.Task[None] | None = None  # the client's resume being caught up, if any
        self.resuming_from = 0  # ... from this seq
        self.resume_pending: int | None = None  # a resume for older events that came meanwhile
        self.slot: tuple[int, int] | None = None  # (user, run) counted in _open_streams
        self.message_tokens, self.tokens_at = client_message_rate()[0], time.monotonic()

    async def connect(self) -> None:
        run_id = parse_db_id(self.scope["url_route"]["kwargs"].get("run_id"))
        if run_id is None:  # not an id: refused as an unknown run is
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.run_id = run_id
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
        if not self._claim_slot():
            log.info(
                "refusing a live stream of run %s: the user has %d open", run_id, max_sockets_per_user_run()
            )
            await self.close(code=CLOSE_TOO_MANY)
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
        for task in (self.poller, self.reader, self.resumer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        slot, self.slot = self.slot, None
        if slot is not None:
            streams = _streams_here()
            streams[slot] -= 1
            if streams[slot] <= 0:
                del streams[slot]
        if self.subscribed:
            self.subscribed = False
            await self.hub.unsubscribe(self.run_id, self.inbox)

    def _claim_slot(self) -> bool:
        """Count this stream against its user's LIVE_MAX_SOCKETS_PER_USER_RUN; False when none is left."""
        slot = (int(self.scope["user"].pk), self.run_id)
        streams = _streams_here()
        if streams[slot] >= max_sockets_per_user_run():
            return False
        streams[slot] += 1
        self.slot = slot
        return True

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
        """``{"type": "resume", "last_seq": N}``: send again every event after N (e.g. after a gap).
        Rate-limited (each message costs a membership check), and one catch-up in flight (``resume``)."""
        if not self._take_message_token():
            burst, refill_s = client_message_rate()
            await self.send_json(
                wire.live_error(
                    f"too many messages: at most {burst:g} at once, then one every {refill_s:g} s; "
                    "this one was ignored"
                )
            )
            return
        if not await self.still_member():
            return
        if not isinstance(content, dict) or content.get("type") != "resume":
            await self.send_json(wire.live_error('expected {"type": "resume", "last_seq": <int>}'))
            return
        seq = content.get("last_seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_DB_ID:
            await self.send_json(wire.live_error("last_seq must be a non-negative integer"))
            return
        self.resume(seq)

    def _take_message_token(self) -> bool:
        """A token bucket: CLIENT_MESSAGE_BURST tokens, one more every CLIENT_MESSAGE_REFILL_S."""
        burst, refill_s = client_message_rate()
        now = time.monotonic()
        self.message_tokens = min(burst, self.message_tokens + (now - self.tokens_at) / max(refill_s, 1e-9))
        self.tokens_at = now
        if self.message_tokens < 1:
            return False
        self.message_tokens -= 1
        return True

    def resume(self, seq: int) -> None:
        """Catch up from ``seq`` in a task of its own, one at a time. A resume that arrives while one is
        in flight joins it when that one started at or before ``seq`` (it sends every event after its
        start, in order: the client gets them); one asking for older events is read once more after it
        (several coalesce into the oldest)."""
        task = self.resumer
        if task is not None and not task.done():
            if seq < self.resuming_from:
                self.resume_pending = seq if self.resume_pending is None else min(self.resume_pending, seq)
            return
        self.resumer = asyncio.create_task(self._resume_from(seq), name=f"live-resume-{self.run_id}")

    async def _resume_from(self, seq: int) -> None:
        start: int | None = seq
        while start is not None:
            self.resuming_from = start
            try:
                await self.catch_up(start)
            except asyncio.CancelledError:
                raise
            except Exception:  # (a DB hiccup: the client may ask again; the poll covers live events)
                log.warning("resume of run %s failed", self.run_id, exc_info=True)
            start, self.resume_pending = self.resume_pending, None

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
    """A non-negative integer query-string parameter (ASCII digits, at most MAX_DB_ID), 0 when absent or
    malformed."""
    from urllib.parse import parse_qs

    raw = parse_qs((scope.get("query_string") or b"").decode("latin-1")).get(name, ["0"])[0]
    value = parse_ascii_int(raw)
    return value if value is not None and 0 <= value <= MAX_DB_ID else 0

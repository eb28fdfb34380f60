"""Following a run live over its websocket (``ws/runs/<id>/``), surviving disconnects.

What the stream guarantees, and what this module adds to make "every point and event exactly once":

- Events carry a gap-free ``seq``. The stream is opened with ``?last_seq=N`` (the last event yielded), so
  after a reconnect the server sends exactly the events after it; any event at or below ``N`` is skipped
  and a gap is read from ``GET .../events?after=N``.
- Metric points are unique per (key, step) but have no sequence number: the socket sends only the points
  stored after it opened. So on every (re)connect, once the server's ``hello`` arrived, the points stored
  before are read from ``GET .../metrics/export/json`` and those not yet yielded are yielded; the
  (key, step) pairs already yielded are remembered, so an overlap is never yielded twice.
- When the run reaches a final state, what the database holds is read once more (points, then events)
  before the iterator ends: the followed points equal the database's.

Authentication is the user's API token in an ``Authorization: Token ...`` header of the handshake. The
server closes with 4401 (token refused) or 4403 (not a member of the run's project): both end the
iteration with :class:`~rlp_client.errors.StreamRefused`; any other close or a network error reconnects
with a backoff.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from rlp_client.errors import ConnectionFailed, ServerError, StreamRefused
from rlp_client.models import FINAL_STATES, Event, MetricPoint
from rlp_client.transport import Transport

REFUSED = {4401, 4403}
Item = Event | MetricPoint


@dataclass
class FollowState:
    """What a follow knows so far (``Run.follow`` exposes it as ``stream.state``)."""

    run_id: int
    last_seq: int = 0
    state: str = ""
    total_steps: int | None = None
    latest_step: int | None = None
    reconnects: int = 0
    seen: set[tuple[str, int]] = field(default_factory=set, repr=False)


def ws_url(base_url: str, run_id: int, last_seq: int) -> str:
    scheme, _, rest = base_url.partition("://")
    ws_scheme = {"https": "wss", "http": "ws"}.get(scheme, scheme)
    return f"{ws_scheme}://{rest.rstrip('/')}/ws/runs/{run_id}/?last_seq={last_seq}"


class LiveStream:
    """An iterator over a run's events and metric points, live; see the module's docstring.

    Args:
        transport: the client's transport (base URL and token).
        run_id: the run.
        last_seq: the last event already seen (0: every event from the first).
        reconnect_backoff_s / reconnect_backoff_max_s: the wait before a reconnect, doubling.
        max_reconnects: give up (``ConnectionFailed``) after this many consecutive failed attempts.
    """

    def __init__(
        self,
        transport: Transport,
        run_id: int,
        *,
        last_seq: int = 0,
        reconnect_backoff_s: float = 0.25,
        reconnect_backoff_max_s: float = 5.0,
        max_reconnects: int = 60,
        open_timeout_s: float = 20.0,
    ) -> None:
        self.transport = transport
        self.state = FollowState(run_id=run_id, last_seq=last_seq)
        self.backoff_s = reconnect_backoff_s
        self.backoff_max_s = reconnect_backoff_max_s
        self.max_reconnects = max_reconnects
        self.open_timeout_s = open_timeout_s
        self.done = False

    def __iter__(self) -> Iterator[Item]:
        failures = 0
        while not self.done:
            try:
                with self._open() as ws:
                    failures = 0
                    yield from self._session(ws)
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                if code in REFUSED:
                    raise StreamRefused(code, exc.rcvd.reason if exc.rcvd else "") from None
            except InvalidStatus as exc:  # refused at the handshake (before accept): a cookie-less 403
                status = exc.response.status_code
                if status in (401, 403, 404):
                    raise StreamRefused(4401 if status == 401 else 4403, f"HTTP {status}") from None
            except (OSError, TimeoutError, InvalidHandshake, ConnectionFailed, ServerError):
                pass  # the server is away (restarting, network): try again below
            if self.done:
                return
            failures += 1
            if failures > self.max_reconnects:
                raise ConnectionFailed(
                    f"run {self.state.run_id}: live stream lost, {failures - 1} reconnects failed"
                )
            self.state.reconnects += 1
            time.sleep(min(self.backoff_s * 2 ** (failures - 1), self.backoff_max_s))

    # --- one connection --------------------------------------------------------------------------------

    def _open(self) -> ClientConnection:
        headers = {"Authorization": f"Token {self.transport.token}"} if self.transport.token else {}
        return connect(
            ws_url(self.transport.base_url, self.state.run_id, self.state.last_seq),
            additional_headers=headers,
            origin=self.transport.base_url,  # the server checks the Origin against its allowed hosts
            open_timeout=self.open_timeout_s,
            close_timeout=2,
            max_size=None,  # a catch-up batch of metrics can be large
            user_agent_header="rlp-client",
        )

    def _session(self, ws: ClientConnection) -> Iterator[Item]:
        hello = json.loads(ws.recv(timeout=self.open_timeout_s))
        if hello.get("kind") == "hello":
            run = hello.get("run") or {}
            self.state.state = str(run.get("state") or "")
            self.state.total_steps = run.get("total_steps")
        # Everything the socket will not send (stored before it opened) comes from the database.
        yield from self._stored_points()
        if self.state.state in FINAL_STATES:
            yield from self._finish()
            return
        while True:
            message = json.loads(ws.recv())
            kind = message.get("kind")
            if kind == "event":
                for event in self._in_order(Event.from_api(message["event"])):
                    yield event  # the whole batch: a gap read from the database may go past the final state
                    if event.new_state is not None:
                        self.state.state = event.new_state
                if self.state.state in FINAL_STATES:
                    yield from self._finish()
                    return
            elif kind == "metrics":
                for key, s in (message.get("series") or {}).items():
                    for step, value, wall in zip(s["steps"], s["values"], s["wall_times"], strict=True):
                        point = self._new_point(key, int(step), float(value), float(wall))
                        if point is not None:
                            yield point

    # --- bookkeeping -----------------------------------------------------------------------------------

    def _new_point(self, key: str, step: int, value: float, wall: float) -> MetricPoint | None:
        if (key, step) in self.state.seen:
            return None
        self.state.seen.add((key, step))
        if self.state.latest_step is None or step > self.state.latest_step:
            self.state.latest_step = step
        return MetricPoint(key, step, value, wall)

    def _in_order(self, event: Event) -> list[Event]:
        """``event`` if it is the next one; the gap before it (from the database) if it skipped ahead."""
        if event.seq <= self.state.last_seq:
            return []
        out = self._stored_events() if event.seq > self.state.last_seq + 1 else []
        if event.seq > self.state.last_seq:
            out.append(event)
            self.state.last_seq = event.seq
        return out

    def _stored_events(self) -> list[Event]:
        out: list[Event] = []
        while True:
            page = self.transport.get(
                f"/api/runs/{self.state.run_id}/events", {"after": self.state.last_seq, "limit": 500}
            )
            events = [Event.from_api(e) for e in page.get("events") or []]
            for event in events:
                if event.seq > self.state.last_seq:
                    out.append(event)
                    self.state.last_seq = event.seq
            if len(events) < 500:
                return out

    def _stored_points(self) -> Iterator[MetricPoint]:
        body = self.transport.get(f"/api/runs/{self.state.run_id}/metrics/export/json")
        for p in body.get("points") or []:
            point = self._new_point(p["key"], int(p["step"]), float(p["value"]), float(p["wall_time"]))
            if point is not None:
                yield point

    def _finish(self) -> Iterator[Item]:
        """The run is final: yield what the database holds that was not yielded yet, then stop."""
        yield from self._stored_points()
        for event in self._stored_events():
            if event.new_state is not None:
                self.state.state = event.new_state
            yield event
        self.done = True

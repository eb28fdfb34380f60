"""The client reads the live stream's messages as ``rl_engine.wire`` describes them.

The client package cannot import the engine (its users install neither pydantic nor the engine), so it
parses the messages itself: this feeds it messages made by the platform's own builders (the ones the
websocket consumer sends) and checks what it yields. A change of the wire format breaks this test."""

from __future__ import annotations

import json
from typing import Any

from rl_engine import wire
from rlp_client.live import LiveStream
from rlp_client.models import Event, MetricPoint


class _Socket:
    """What ``LiveStream`` reads from a websocket: ``recv`` hands out the queued messages as JSON text."""

    def __init__(self, messages: list[Any]) -> None:
        self.frames = [json.dumps(m) for m in messages]

    def recv(self, timeout: float | None = None) -> str:
        return self.frames.pop(0)


class _Transport:
    """Nothing stored before the socket opened, nothing after (every item comes through the socket)."""

    base_url, token = "http://platform.invalid", None

    def get(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"points": []} if path.endswith("/metrics/export/json") else {"events": []}


def test_the_client_follows_a_stream_of_wire_built_messages():
    stream = LiveStream(_Transport(), run_id=7)  # type: ignore[arg-type]
    hello = wire.live_hello({"id": 7, "state": "running", "total_steps": 2, "last_seq": 0})
    log = wire.live_event(seq=1, kind=wire.EventKind.LOG, message="step 1", data={}, created="t1")
    live = wire.live_metrics([("loss", 1, 0.5, 10.0), ("loss", 2, 0.25, 11.0), ("reward", 2, 1.0, 11.0)])
    polled = wire.live_metrics([("loss", 2, 0.25, 11.0), ("loss", 3, 0.125, 12.0)], source="poll")
    done = wire.live_event(seq=2, kind="status", message="running → succeeded",
                           data={"from": "running", "to": "succeeded"}, created="t2")  # fmt: skip
    items = list(stream._session(_Socket([hello, log, live, polled, done])))

    assert items == [
        Event(1, "log", "step 1", {}, "t1"),
        MetricPoint("loss", 1, 0.5, 10.0),
        MetricPoint("loss", 2, 0.25, 11.0),
        MetricPoint("reward", 2, 1.0, 11.0),
        MetricPoint("loss", 3, 0.125, 12.0),  # (loss, 2) was yielded already
        Event(2, "status", "running → succeeded", {"from": "running", "to": "succeeded"}, "t2"),
    ]
    assert (stream.state.state, stream.state.total_steps, stream.state.last_seq) == ("succeeded", 2, 2)
    assert stream.done

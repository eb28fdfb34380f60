"""Tracking writes: idempotent metrics (first value wins), gap-free event sequence, live publish, caps."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from experiments.models import RunState
from experiments.services import run_create
from tests.factories import RunFactory
from tracking import live
from tracking.bus import Envelope
from tracking.coverage import Span
from tracking.models import Checkpoint, MetricPoint, RunEvent, Sample
from tracking.services import (
    NewEvent,
    NewSample,
    Point,
    events_append,
    events_ingest,
    metrics_ingest,
    samples_record,
)


@pytest.fixture
def run(team, experiment):
    return run_create(experiment=experiment, user=team["member"])


def pts(key: str, steps, value=1.0) -> list[Point]:
    return [
        Point(key=key, step=s, value=float(value if value is not None else s), wall_time=1e9 + s)
        for s in steps
    ]


@pytest.mark.smoke
def test_metric_retries_add_nothing_and_the_first_value_wins(run):
    first = metrics_ingest(run_id=run.pk, points=pts("reward/mean", range(100), value=0.5))
    again = metrics_ingest(run_id=run.pk, points=pts("reward/mean", range(100), value=0.5))
    changed = metrics_ingest(run_id=run.pk, points=pts("reward/mean", range(90, 110), value=9.0))
    assert (first.inserted, again.inserted, changed.inserted) == (100, 0, 10)
    assert MetricPoint.objects.filter(run=run).count() == 110
    assert MetricPoint.objects.get(run=run, key="reward/mean", step=95).value == 0.5  # kept the first
    assert MetricPoint.objects.get(run=run, key="reward/mean", step=105).value == 9.0


def test_duplicates_inside_one_batch_keep_the_first(run):
    batch = [Point("k", 1, 1.0, 0.0), Point("k", 1, 2.0, 0.0), Point("j", 1, 3.0, 0.0)]
    assert metrics_ingest(run_id=run.pk, points=batch).inserted == 2
    assert MetricPoint.objects.get(run=run, key="k", step=1).value == 1.0


def test_non_finite_values_are_rejected(run):
    with pytest.raises(ValueError, match="finite"):
        metrics_ingest(run_id=run.pk, points=[Point("k", 1, float("nan"), 0.0)])
    assert not MetricPoint.objects.filter(run=run).exists()


@pytest.mark.smoke
def test_stored_metrics_and_events_are_published_to_the_run_group_after_commit(
    run, listen, django_capture_on_commit_callbacks
):
    listener = listen(run.pk)
    with django_capture_on_commit_callbacks(execute=True):
        metrics_ingest(run_id=run.pk, points=[Point("loss", 3, 0.25, 10.0), Point("loss", 4, 0.2, 11.0)])
    envelope = listener.receive()
    assert (envelope.run_id, envelope.kind) == (run.pk, "metrics")
    batch = list(MetricPoint.objects.filter(run=run).order_by("id").values_list("id", flat=True))
    assert [(s.start, s.end, s.first_id, s.last_id) for s in envelope.spans] == [(0, 2, batch[0], batch[1])]
    assert json.loads(envelope.text) == {
        "kind": "metrics",
        "count": 2,
        "series": {"loss": {"steps": [3, 4], "values": [0.25, 0.2], "wall_times": [10.0, 11.0]}},
    }
    with django_capture_on_commit_callbacks(execute=True):
        event = events_append(run_id=run.pk, kind="log", message="hello", data={"line": 1})
    envelope = listener.receive()
    assert (envelope.kind, envelope.seq) == ("event", event.seq)
    payload = json.loads(envelope.text)
    assert payload["kind"] == "event"
    assert payload["event"] | {"created": None} == {
        "seq": event.seq,
        "kind": "log",
        "message": "hello",
        "data": {"line": 1},
        "created": None,
    }


def test_nothing_is_published_when_the_transaction_rolls_back(
    run, listen, django_capture_on_commit_callbacks
):
    from django.db import transaction

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        try:
            with transaction.atomic():
                events_append(run_id=run.pk, kind="log", message="never stored")
                raise RuntimeError("abort")
        except RuntimeError:
            pass
    assert callbacks == []
    assert not RunEvent.objects.filter(run=run, message="never stored").exists()


def test_publish_with_an_unreachable_bus_logs_instead_of_raising(settings, caplog):
    settings.LIVE_BUS = {"url": "redis://127.0.0.1:1/0", "prefix": "nowhere"}
    assert live.publish(1, {"kind": "event", "event": {"seq": 1}}) is False
    assert "live publish to run 1 failed" in caplog.text


class RecordingBus:
    """A bus that records what is published to it (an outbox's sends), each send after ``delay``."""

    name = "recording"

    def __init__(self, delay: Any = None) -> None:
        self.sent: list[Envelope] = []
        self.delay = delay

    async def publish(self, envelope: Envelope) -> None:
        if self.delay is not None:
            await self.delay(envelope)
        self.sent.append(envelope)

    def publish_sync(self, envelope: Envelope) -> None:
        self.sent.append(envelope)

    def reader(self) -> Any:
        raise NotImplementedError


def test_in_the_web_server_a_publish_leaves_the_request_at_once_and_messages_keep_their_order(monkeypatch):
    """A sync view runs in a worker thread beside the server's event loop (recorded by the ASGI
    application's ``ServerLoop``): publish hands the message to that loop and returns before it is sent;
    one sender keeps the publish order. (Called synchronously, the three sends would be recorded before
    "returned".)"""
    log: list[object] = []

    async def slow(envelope: Envelope) -> None:
        n = json.loads(envelope.text)["n"]
        await asyncio.sleep(0.01 * (3 - n))  # later ones are quicker to send
        log.append((envelope.run_id, n))

    bus = RecordingBus(slow)
    monkeypatch.setattr(live, "live_bus", lambda: bus)

    def view() -> None:
        for n in range(3):
            assert live.publish(7, {"n": n}) is True
        log.append("returned")

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await sync_to_async(view)()

    async def server() -> None:
        await live.ServerLoop(app)({"type": "http"}, None, None)
        for _ in range(200):
            if len(log) == 4:
                break
            await asyncio.sleep(0.01)

    asyncio.run(server())
    assert log == ["returned", (7, 0), (7, 1), (7, 2)]


def _metrics(step: int) -> dict:
    return {
        "kind": "metrics",
        "count": 1,
        "series": {"k": {"steps": [step], "values": [0.0], "wall_times": [0.0]}},
    }


def test_waiting_metrics_merge_while_a_send_is_in_flight_and_nothing_is_reordered(monkeypatch):
    """Per run, one send in flight; metrics published meanwhile go out as one message, each key's points
    in publish order, naming every stored batch it carries; an event is never merged and keeps its place
    between the metrics around it."""
    in_flight = threading.Event()
    gate = asyncio.Event()

    async def held(envelope: Envelope) -> None:
        in_flight.set()
        await gate.wait()  # the first send is in flight until the view published everything

    bus = RecordingBus(held)
    monkeypatch.setattr(live, "live_bus", lambda: bus)

    def batch(step: int) -> Span:
        return Span(start=step, end=step + 1, first_id=10 * step, last_id=10 * step)

    def view() -> None:
        live.publish(1, _metrics(0), span=batch(0))
        assert in_flight.wait(10)
        for step in (1, 2):
            live.publish(1, _metrics(step), span=batch(step))
        live.publish(1, {"kind": "event", "event": {"seq": 1}})
        live.publish(1, _metrics(3), span=batch(3))
        live.publish(1, _metrics(4), span=batch(4))

    async def server() -> None:
        live.bind_server_loop(asyncio.get_running_loop())  # as the ASGI application's ServerLoop does
        await sync_to_async(view)()
        gate.set()
        deadline = time.monotonic() + 10
        while len(bus.sent) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    asyncio.run(server())
    payloads = [json.loads(e.text) for e in bus.sent]
    assert [p["kind"] for p in payloads] == ["metrics", "metrics", "event", "metrics"]
    assert [e.kind for e in bus.sent] == ["metrics", "metrics", "event", "metrics"]
    assert [p["series"]["k"]["steps"] for p in payloads if p["kind"] == "metrics"] == [[0], [1, 2], [3, 4]]
    assert [[s.start for s in e.spans] for e in bus.sent if e.kind == "metrics"] == [[0], [1, 2], [3, 4]]
    assert [p["count"] for p in payloads if p["kind"] == "metrics"] == [1, 2, 2]
    assert bus.sent[2].seq == 1


def test_unknown_event_kind_is_refused(run):
    with pytest.raises(ValueError, match="unknown event kind"):
        events_append(run_id=run.pk, kind="gossip", message="x")


def test_checkpoint_events_record_checkpoints(run):
    events_ingest(
        run_id=run.pk,
        events=[
            NewEvent(kind="checkpoint", message="saved", data={"step": 5, "path": "/c/5", "size_bytes": 7}),
            NewEvent(kind="log", message="line"),
        ],
    )
    assert list(Checkpoint.objects.filter(run=run).values_list("step", "path", "size_bytes")) == [
        (5, "/c/5", 7)
    ]


def test_samples_are_capped_per_step(run, settings):
    settings.SAMPLES_PER_STEP_CAP = 3
    stored = samples_record(
        run_id=run.pk, samples=[NewSample(step=1, prompt=f"p{i}", response="r") for i in range(5)]
    )
    stored += samples_record(
        run_id=run.pk,
        samples=[
            NewSample(step=1, prompt="late", response="r"),
            NewSample(step=2, prompt="q", response="r", reward=1.0),
        ],
    )
    assert stored == 4
    assert list(Sample.objects.filter(run=run, step=1).values_list("prompt", flat=True)) == ["p0", "p1", "p2"]
    assert Sample.objects.filter(run=run, step=2).count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_event_writers_get_distinct_gap_free_sequence_numbers(team, experiment):
    # A finished run: a launcher worker still running (another suite's) may run a late task, and every one of
    # them admits queued runs (writing status events); nothing touches a finished run.
    run = RunFactory(experiment=experiment, state=RunState.SUCCEEDED)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(10):
                events_append(run_id=run.pk, kind="log", message=f"w{n}-{i}")
        except BaseException as exc:  # surfaced below; a thread's exception would otherwise vanish
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, 41))

"""The engine's HTTP sink against a stand-in ingestion server (a local HTTP server that can go down and
come back, or hold a request); its answers to refusals are tested against the real platform in
test_sink_refusals.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rl_engine.sinks.http import HttpSink
from rl_engine.sinks.http_replies import MAX_RETRY_AFTER_S, retry_after_s
from tests.conftest import wait_for


class Recorder:
    """A stand-in ingestion server: stores what it is sent, answers like the platform does."""

    def __init__(self, port: int, token: str = "secret"):
        self.port, self.token = port, token
        self.requests: list[tuple[str, dict]] = []
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.headers.get("Authorization") != f"Token {recorder.token}":
                    self.send_response(401)
                elif self.path.endswith("/events") and any(e["kind"] == "bogus" for e in body["events"]):
                    self.send_response(400)
                else:
                    recorder.requests.append((self.path, body))
                    self.send_response(201)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.allow_reuse_address = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def points(self) -> list[tuple[str, int, float]]:
        return [(p["key"], p["step"], p["value"]) for path, body in self.requests if path.endswith("/metrics")
                for p in body["points"]]  # fmt: skip

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server() -> Iterator[Recorder]:
    rec = Recorder(_free_port())
    rec.start()
    yield rec
    rec.stop()


def make_sink(server: Recorder, tmp_path, **kw) -> HttpSink:
    opts = {
        "heartbeat_interval_s": 0.2,
        "max_backoff_s": 0.2,
        "close_timeout_s": 10.0,
    }
    return HttpSink(f"http://127.0.0.1:{server.port}", server.token, 7, spool_dir=tmp_path, **(opts | kw))


def test_points_events_and_samples_arrive_batched_and_once(server, tmp_path):
    sink = make_sink(server, tmp_path)  # the default 50 ms wait after the first item: one request per burst
    for step in range(50):
        sink.log_metrics(step, {"reward/mean": step / 10, "actor/pg_loss": -step, "bad": float("nan")})
    sink.log_event("checkpoint", "checkpoint at step 49", {"step": 49, "path": "/c", "size_bytes": 1})
    sink.log_samples(48, [{"prompt": "a", "response": "b", "reward": 1.0}])
    sink.log_samples(49, [{"prompt": "c", "response": "d", "reward": 0.0}])
    sink.close()
    points = server.points()
    assert sorted(points) == sorted([("reward/mean", s, s / 10) for s in range(50)] +
                                    [("actor/pg_loss", s, -s) for s in range(50)])  # fmt: skip
    assert server.paths().count("/api/runs/7/metrics") < 10  # batched, not one request per step
    batch_ids = [b.pop("batch_id") for p, b in server.requests if p.endswith(("/events", "/samples"))]
    assert len(set(batch_ids)) == len(batch_ids) == 2  # event and sample batches carry their own id
    events = [b for p, b in server.requests if p.endswith("/events")]
    assert events == [{"events": [{"kind": "checkpoint", "message": "checkpoint at step 49",
                                   "data": {"step": 49, "path": "/c", "size_bytes": 1}}]}]  # fmt: skip
    samples = [b for p, b in server.requests if p.endswith("/samples")]
    assert samples == [{"samples": [{"prompt": "a", "response": "b", "reward": 1.0, "step": 48},
                                    {"prompt": "c", "response": "d", "reward": 0.0, "step": 49}]}]  # fmt: skip
    assert not sink.spool.path.exists()  # everything delivered: no backlog left behind


def test_an_outage_is_spooled_to_disk_and_delivered_when_the_platform_returns(server, tmp_path):
    server.stop()
    sink = make_sink(server, tmp_path)
    for step in range(20):
        sink.log_metrics(step, {"reward/mean": float(step)})
    wait_for(lambda: sink.spool.path.exists() and sink.spool.path.stat().st_size > 0, timeout_s=10,
             message="the undeliverable batches to be spooled")  # fmt: skip
    time.sleep(0.5)  # several failed attempts while down
    assert server.points() == []
    server.start()
    for step in range(20, 30):
        sink.log_metrics(step, {"reward/mean": float(step)})
    sink.close()
    assert sorted(server.points()) == [("reward/mean", s, float(s)) for s in range(30)]


def test_heartbeats_are_posted_in_the_background(server, tmp_path):
    sink = make_sink(server, tmp_path)
    wait_for(
        lambda: server.paths().count("/api/runs/7/heartbeat") >= 2, timeout_s=10, message="two heartbeats"
    )
    sink.close()


def test_missing_or_wrong_environment_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.delenv("RL_ENGINE_INGEST_TOKEN", raising=False)
    monkeypatch.delenv("RL_ENGINE_INGEST_TOKEN_FILE", raising=False)
    monkeypatch.setenv("RL_ENGINE_INGEST_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("RL_ENGINE_RUN_ID", "3")
    with pytest.raises(
        ValueError, match=r"RL_ENGINE_INGEST_TOKEN_FILE \(or RL_ENGINE_INGEST_TOKEN\) is not set"
    ):
        HttpSink.from_env()
    monkeypatch.setenv("RL_ENGINE_INGEST_TOKEN_FILE", "ingest-token")
    with pytest.raises(ValueError, match="must be an absolute path"):
        HttpSink.from_env()
    monkeypatch.setenv("RL_ENGINE_INGEST_TOKEN_FILE", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match=r"cannot read the ingest token file .*absent"):
        HttpSink.from_env()
    (tmp_path / "blank").write_text("\n")
    monkeypatch.setenv("RL_ENGINE_INGEST_TOKEN_FILE", str(tmp_path / "blank"))
    with pytest.raises(ValueError, match="is empty"):
        HttpSink.from_env()


def test_retry_after_is_read_as_seconds_or_an_http_date_and_bounded():
    now = 1_700_000_000.0
    assert retry_after_s("7", now=now) == 7
    assert retry_after_s("0", now=now) == 1  # never a busy loop
    assert retry_after_s(formatdate(now + 42, usegmt=True), now=now) == pytest.approx(42)
    assert retry_after_s(formatdate(now - 42, usegmt=True), now=now) == 1  # a date already past
    assert retry_after_s("86400", now=now) == MAX_RETRY_AFTER_S  # asked again after that
    assert retry_after_s(None) is None and retry_after_s("soon") is None  # the sink's own backoff then


def test_the_cursor_records_each_delivered_batch_before_the_next_is_sent(tmp_path):
    """A crash between two deliveries must not send the first again: the cursor moves per batch."""
    entered, gate = threading.Event(), threading.Event()
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.path)
            if self.path.endswith("/events"):  # the second batch of the pass waits here
                entered.set()
                gate.wait(30)
            self.send_response(201)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    sink = HttpSink(f"http://127.0.0.1:{httpd.server_port}", "t", 7, spool_dir=tmp_path, flush_interval_s=0.3,
                    heartbeat_interval_s=600)  # fmt: skip
    try:
        sink.log_metrics(1, {"x": 1.0})
        sink.log_event("status", "one pass: metrics, then this event")
        assert entered.wait(10)
        first_line = sink.spool.path.read_bytes().split(b"\n")[0]
        assert b'"endpoint": "metrics"' in first_line
        assert int(sink.spool.cursor_path.read_text()) == len(first_line) + 1  # the metrics batch is recorded
    finally:
        gate.set()
        sink.close()
        httpd.shutdown()
    assert [p.rsplit("/", 1)[1] for p in seen if not p.endswith("/heartbeat")] == ["metrics", "events"]


def test_after_a_429_a_due_heartbeat_goes_before_the_backlog(tmp_path):
    """A stand-in platform, because the order must be chosen: the real one counts heartbeats and batches
    in one rate-limit window, and which reaches a reopened window first is a race there. Here the
    heartbeat thread's request hangs (its heartbeat cannot get through) and the first batch gets a 429;
    the heartbeat then due must be sent before the batch is retried, or the token could expire."""
    gate, seen = threading.Event(), []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            endpoint = self.path.rsplit("/", 1)[1]
            first = endpoint not in [e for e, _ in seen]
            status = 429 if endpoint == "metrics" and first else 200
            seen.append((endpoint, status))
            if endpoint == "heartbeat" and first:
                gate.wait(30)  # the heartbeat thread's first request: held until the test ends
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", "1")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    sink = HttpSink(f"http://127.0.0.1:{httpd.server_port}", "t", 7, spool_dir=tmp_path, heartbeat_interval_s=0.2,
                    request_timeout_s=60, flush_interval_s=0)  # fmt: skip
    try:
        wait_for(lambda: seen, timeout_s=10, message="the heartbeat thread's first heartbeat")
        sink.log_metrics(1, {"x": 1.0})
        wait_for(lambda: ("metrics", 200) in seen, timeout_s=20, message="the batch to be sent again")
    finally:
        gate.set()
        sink.close()
        httpd.shutdown()
    assert seen[:4] == [("heartbeat", 200), ("metrics", 429), ("heartbeat", 200), ("metrics", 200)]


class SlowKeepAlive:
    """A stand-in platform speaking HTTP/1.1 with keep-alive that takes ``answer_s`` to answer each data
    POST; it records which client connection (address, port) sent what, and the most data requests it
    ever had in flight at once."""

    def __init__(self, answer_s: float):
        self.connections: list[tuple[tuple[str, int], str, int]] = []  # (client, endpoint, items)
        self.in_flight = self.max_in_flight = 0
        lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint = self.path.rsplit("/", 1)[1]
                items = len(body.get("points") or body.get("events") or body.get("samples") or [])
                data = endpoint != "heartbeat"
                with lock:
                    stand_in.connections.append((self.client_address, endpoint, items))
                    if data:
                        stand_in.in_flight += 1
                        stand_in.max_in_flight = max(stand_in.max_in_flight, stand_in.in_flight)
                if data:
                    time.sleep(answer_s)
                    with lock:
                        stand_in.in_flight -= 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_one_keep_alive_connection_carries_every_batch(tmp_path):
    """urllib opened a TCP connection per POST; the sink now reuses one for its data (and one for its
    heartbeats) however many batches it sends."""
    platform = SlowKeepAlive(answer_s=0.0)
    sink = HttpSink(platform.url, "t", 7, spool_dir=tmp_path, flush_interval_s=0.0, heartbeat_interval_s=0.1)
    try:
        for step in range(40):
            sink.log_metrics(step, {"x": float(step)})
            time.sleep(0.01)
        sink.log_event("log", "done")
        sink.close()
    finally:
        platform.close()
    data = [c for c, endpoint, _ in platform.connections if endpoint != "heartbeat"]
    heartbeats = [c for c, endpoint, _ in platform.connections if endpoint == "heartbeat"]
    assert len(data) >= 10 and len(set(data)) == 1  # many batches, one connection
    assert len(heartbeats) >= 2 and len(set(heartbeats)) == 1 and set(heartbeats) != set(data)
    assert sum(n for _, endpoint, n in platform.connections if endpoint == "metrics") == 40


def test_a_slow_platform_gets_one_request_at_a_time_each_carrying_what_accumulated(tmp_path):
    """The engine logs a step every 10 ms; the platform takes 200 ms per answer. The sink never has two
    data requests in flight, and its requests grow instead of queueing: about one per answer time, all
    points delivered once."""
    platform = SlowKeepAlive(answer_s=0.2)
    sink = HttpSink(platform.url, "t", 7, spool_dir=tmp_path, flush_interval_s=0.01, heartbeat_interval_s=600)
    try:
        t0 = time.monotonic()
        for step in range(150):
            sink.log_metrics(step, {"a": 1.0, "b": 2.0})
            time.sleep(max(0.0, t0 + (step + 1) * 0.01 - time.monotonic()))
        logging_s = time.monotonic() - t0
        sink.close()
    finally:
        platform.close()
    sizes = [n for _, endpoint, n in platform.connections if endpoint == "metrics"]
    assert platform.max_in_flight == 1
    assert sum(sizes) == 300  # every point, once
    # One request per 200 ms answer (plus the first and the drain), not one per 10 ms step.
    assert len(sizes) <= logging_s / 0.2 + 3, sizes
    assert max(sizes) >= 20  # later requests carry what accumulated while the previous one was answered

"""The client's transport against a real HTTP server that misbehaves on purpose (a stand-in for a proxy
in front of the platform: 503s, 429s with Retry-After, dropped connections): which calls are retried,
how often, how long it waits, and what error comes out. The platform itself is exercised in
tests/launcher/test_client.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlp_client import (
    BadRequest,
    ConnectionFailed,
    NotFound,
    RateLimited,
    RetryPolicy,
    ServerError,
)
from rlp_client.transport import Transport

FAST = RetryPolicy(retries=3, backoff_s=0.01, backoff_max_s=0.02, retry_after_max_s=0.3)


class Script:
    """Answers to give, in order (then 200 {"ok": true}), and the requests seen."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict, dict]] = []  # (status, body, headers)
        self.seen: list[tuple[str, str, float]] = []  # (method, path, time)
        self.drop = 0  # close the next N connections without answering


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            script.seen.append((self.command, self.path, time.monotonic()))
            if script.drop:
                script.drop -= 1
                self.connection.shutdown(socket.SHUT_RDWR)  # no answer at all
                return
            status, body, headers = script.answers.pop(0) if script.answers else (200, {"ok": True}, {})
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    httpd.shutdown()
    httpd.server_close()


def test_idempotent_calls_are_retried_on_503_429_and_dropped_connections(server):
    url, script = server
    t = Transport(url, "rlp_x", retry=FAST)
    script.answers = [(503, {"detail": "busy"}, {}), (429, {"detail": "slow down"}, {"Retry-After": "0.2"})]
    script.drop = 0
    assert t.get("/api/runs/1") == {"ok": True}
    assert [m for m, _, _ in script.seen] == ["GET", "GET", "GET"]
    assert script.seen[2][2] - script.seen[1][2] >= 0.19  # Retry-After was honoured
    script.seen.clear()
    script.drop = 2
    t.delete("/api/tokens/3")
    assert [m for m, _, _ in script.seen] == ["DELETE"] * 3


def test_a_post_is_never_sent_twice(server):
    url, script = server
    t = Transport(url, "rlp_x", retry=FAST)
    script.answers = [(503, {"detail": "busy"}, {})]
    with pytest.raises(ServerError):
        t.post("/api/runs", {"experiment": 1})
    script.drop = 1
    with pytest.raises(ConnectionFailed):
        t.post("/api/runs", {"experiment": 1})
    assert [m for m, _, _ in script.seen] == ["POST", "POST"]


def test_retries_give_up_with_the_last_answer_and_other_errors_are_not_retried(server):
    url, script = server
    t = Transport(url, "rlp_x", retry=FAST)
    script.answers = [(429, {"detail": "slow down"}, {"Retry-After": "0"})] * 4
    with pytest.raises(RateLimited) as info:
        t.get("/api/runs")
    assert info.value.retry_after == 0 and len(script.seen) == 4  # 1 + 3 retries
    script.seen.clear()
    script.answers = [
        (400, {"detail": "Invalid input.", "errors": {"config.trainer.lr": ["must be > 0"]}}, {})
    ]
    with pytest.raises(BadRequest) as bad:
        t.get("/api/runs")
    assert bad.value.errors == {"config.trainer.lr": ["must be > 0"]}
    assert bad.value.one_line() == "config.trainer.lr: must be > 0" and len(script.seen) == 1
    script.answers = [(404, {"detail": "Not found."}, {})]
    with pytest.raises(NotFound):
        t.get("/api/runs/9")


def test_an_unreachable_server_is_connection_failed_after_the_retries():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens on it once closed
    t = Transport(f"http://127.0.0.1:{port}", None, retry=FAST)
    with pytest.raises(ConnectionFailed):
        t.get("/api/me")


def test_pages_are_followed(server):
    url, script = server
    t = Transport(url, "rlp_x", retry=FAST)
    script.answers = [
        (200, {"count": 3, "next": "x", "results": [{"id": 1}, {"id": 2}]}, {}),
        (200, {"count": 3, "next": None, "results": [{"id": 3}]}, {}),
    ]
    assert [r["id"] for r in t.pages("/api/runs", {"state": "running"}, page_size=2)] == [1, 2, 3]
    assert [p for _, p, _ in script.seen] == [
        "/api/runs?state=running&limit=2&offset=0",
        "/api/runs?state=running&limit=2&offset=2",
    ]

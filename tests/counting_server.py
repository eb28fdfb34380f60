"""A local HTTP server that counts the requests it gets (any method) and answers every GET with a small
CSV file: the internal service a hostile dataset card points at."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODY = b"question,answer\nfrom the internal service,1\n"


@dataclass
class CountingServer:
    port: int = 0
    paths: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> int:
        return len(self.paths)


@contextmanager
def counting_server() -> Iterator[CountingServer]:
    state = CountingServer()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _count(self) -> None:
            with lock:
                state.paths.append(f"{self.command} {self.path}")

        def do_GET(self) -> None:
            self._count()
            self.send_response(200)
            self.send_header("Content-Type", "text/csv")
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

        def do_HEAD(self) -> None:
            self._count()
            self.send_response(200)
            self.send_header("Content-Type", "text/csv")
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

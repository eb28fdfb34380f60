"""The production web tier: gunicorn managing ``WEB_CONCURRENCY`` uvicorn worker processes on one port.

    PYTHONPATH=platform gunicorn -c python:config.gunicorn -b 0.0.0.0:8000 config.asgi:application

Each worker is a full ASGI server (uvicorn with uvloop and httptools) running the whole application:
REST API, pages, websockets and the engine's ingestion endpoints. The workers share nothing but the
listening socket, PostgreSQL and Redis: a websocket on any worker receives every run's live messages
through the Redis live bus (tracking/bus.py), and the rate-limit counters live in the Redis cache. gunicorn starts
a new worker when one exits or stops answering its heartbeat for ``timeout`` seconds.

Chosen by measurement (docs/benchmarks.md, "The web tier under load"; side by side, on a loaded
machine): a uvicorn worker served 30-point metrics POSTs at 20-22 ms of CPU each against 26 ms for
daphne on the old path, and 1000-point batches at 5-8 requests/s against 3.5; gunicorn's supervision
(a worker that dies or hangs is replaced) was within the noise of ``uvicorn --workers``.

``WEB_CONCURRENCY``: how many worker processes (default: the CPUs this process may run on). Without
``REDIS_URL`` (the embedded default: an in-process live bus and cache) only one process can
serve, and a larger value is refused.
"""

from __future__ import annotations

import os


def web_concurrency() -> int:
    """``WEB_CONCURRENCY`` (default: the usable CPUs); 1 without Redis."""
    raw = os.environ.get("WEB_CONCURRENCY", "").strip()
    try:
        n = int(raw) if raw else len(os.sched_getaffinity(0))
    except ValueError:
        raise SystemExit(f"error: WEB_CONCURRENCY={raw!r} is not an integer") from None
    if n < 1:
        raise SystemExit(f"error: WEB_CONCURRENCY={raw!r} must be at least 1")
    if not os.environ.get("REDIS_URL", "").strip():
        if raw and n > 1:
            raise SystemExit(
                "error: WEB_CONCURRENCY > 1 needs REDIS_URL: without Redis the live bus and the "
                "rate-limit counters live in one process"
            )
        return 1
    return n


workers = web_concurrency()
worker_class = "config.web_worker.Worker"
bind = [os.environ.get("WEB_BIND", "127.0.0.1:8000")]  # -b on the command line wins
keepalive = 20  # s an idle keep-alive connection stays open (the engine's sink reuses its connection)
timeout = 60  # s without a heartbeat from a worker before gunicorn replaces it
graceful_timeout = 10  # s a stopping worker gets to finish its requests and close its websockets
accesslog = None  # ingestion is hundreds of requests a second: no access log by default
# gunicorn's control socket (runtime worker management) sits at one path per user: two deployments on
# one host would fight over it, and nothing here uses it.
control_socket_disable = True

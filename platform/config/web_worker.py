"""The uvicorn worker gunicorn runs (config/gunicorn.py): uvloop and httptools when installed
(``uvicorn[standard]``), no ASGI lifespan (Django has none), and proxy headers left to Django
(``DJANGO_SECURE_PROXY_SSL_HEADER``), as daphne did.

No permessage-deflate on websockets: browsers offer it, and each socket then compresses every live
message again with its own compressor, where the hub encodes a message once for all of a run's
followers (tracking/hub.py). Under a sweep's load (20 runs, 100 browser-like followers) that cost the web
process measurable CPU and latency (docs/benchmarks.md); a follower of a busy run receives tens of
kilobytes a second uncompressed."""

from __future__ import annotations

from uvicorn_worker import UvicornWorker


class Worker(UvicornWorker):
    CONFIG_KWARGS = {
        "loop": "auto",
        "http": "auto",
        "ws": "auto",
        "ws_per_message_deflate": False,
        "lifespan": "off",
        "proxy_headers": False,
        "access_log": False,
    }

"""The uvicorn worker gunicorn runs (config/gunicorn.py): uvloop and httptools when installed
(``uvicorn[standard]``), no ASGI lifespan (Django has none), and proxy headers left to Django
(``DJANGO_SECURE_PROXY_SSL_HEADER``), as daphne did."""

from __future__ import annotations

from uvicorn_worker import UvicornWorker


class Worker(UvicornWorker):
    CONFIG_KWARGS = {
        "loop": "auto",
        "http": "auto",
        "ws": "auto",
        "lifespan": "off",
        "proxy_headers": False,
        "access_log": False,
    }

"""The ingestion front: the engine's metrics and samples POSTs served beside Django's request cycle.

The engine's sink posts a metrics batch to ``/api/runs/<id>/metrics`` many times a second per run, and
its samples to ``/api/runs/<id>/samples`` about once a second. Through
Django's ASGI handler each one paid a new thread (asgiref's per-request executor), a database connection
taken from the pool and checked with a query, three thread hops through the middleware chain, the
ORM-built token query and DRF's request machinery: 12-15 ms of web CPU for 30 points. ``IngestFront``
wraps the ASGI application and serves that one request shape itself, in one hop onto a small pool of
long-lived threads (each keeps its database connection):

- the same URL (Django's resolver decides), the same host check (``ALLOWED_HOSTS``), the same HTTPS
  redirect rule and response headers (Django's SecurityMiddleware, CommonMiddleware and
  XFrameOptionsMiddleware, called directly; DRF's ``Allow`` and ``Vary``);
- the same authentication (``TokenAuthentication``'s checks, ``ingest_token``), JSON parser
  (``NulSafeJSONParser``), batch limit, wire validation (``rl_engine.wire``), throttle (``IngestThrottle``'s
  key and window) and storage (``services.metrics_batch_store``: idempotent on (run, key, step), published live
  after it is stored; ``services.samples_batch_store``: capped per step, idempotent on the batch id: what the views
  call);
- the same answer: the view's status (200 for metrics, 201 for samples) and reply model
  (``MetricsReply``, ``SamplesReply``), rendered by the view's JSON renderer.

Only a success is answered here. Anything else (another token or a session, a body that does not parse
or validate, a batch over the limit, a throttled token, a disallowed host, an ``Accept`` or a query
string that could change the rendering, an error while storing) is handed, body and all, to the Django
application, which answers it exactly as before: the error bodies are Django's own. Nothing was stored
by then, except after an error inside ``metrics_ingest``, and storing is idempotent, so the second
attempt stores nothing twice. A throttled token's request is counted twice (here, then by DRF): it
was over the limit already.
"""

from __future__ import annotations

import asyncio
import io
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.db import connection, connections
from django.http import HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.security import SecurityMiddleware
from django.urls import Resolver404, resolve
from django.utils.cache import patch_vary_headers
from pydantic import BaseModel
from rest_framework import exceptions
from rest_framework.views import APIView

from accounts.authentication import ingest_token
from accounts.parsers import NulSafeJSONParser
from accounts.throttles import IngestThrottle
from rl_engine import wire
from tracking import live
from tracking.api import RunMetricsView, RunSamplesView
from tracking.services import metrics_batch_store, samples_batch_store

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

THREADS = 4  # per web process: requests stored at once (each thread holds one database connection)
_ACCEPTED = {"", "*/*", "application/json"}  # DRF picks the JSON renderer for these
_JSON_TYPES = {"application/json", "application/json; charset=utf-8"}

# Built once per process, not per request.
_parser = NulSafeJSONParser()
_renderer = RunMetricsView.renderer_classes[0]()  # what DRF picks for these Accept values (both views)
assert RunSamplesView.renderer_classes[0] is type(_renderer)
_middleware = [
    m(lambda request: None) for m in (SecurityMiddleware, CommonMiddleware, XFrameOptionsMiddleware)
]


def _view_headers(view_class: type[APIView]) -> dict[str, str]:
    """What DRF adds to the view's every answer (``APIView.default_response_headers``)."""
    view = view_class()
    view.setup(None)
    return view.default_response_headers


@dataclass(frozen=True)
class Route:
    """One endpoint the front serves: its wire name, body model, storage, and the Django view that answers
    it otherwise (its success status, and the headers DRF adds to its answers)."""

    endpoint: str
    body: type[BaseModel]
    store: Callable[[int, Any], BaseModel]
    status: int
    view: type[APIView]


ROUTES = {  # by URL name
    "api-run-metrics": Route(wire.METRICS, wire.MetricsBody, metrics_batch_store, 200, RunMetricsView),
    "api-run-samples": Route(wire.SAMPLES, wire.SamplesBody, samples_batch_store, 201, RunSamplesView),
}
_PATH_ENDS = tuple("/" + route.endpoint for route in ROUTES.values())  # what may be one of them


def serve(scope: Scope, body: bytes) -> HttpResponse | None:
    """The answer to a metrics or samples POST with its run's ingest token, the batch stored; None for any
    other request (the Django application answers it). Runs in the front's threads."""
    if scope.get("query_string") or scope.get("root_path"):
        return None
    try:
        request = ASGIRequest(scope, io.BytesIO(body))
        match = resolve(request.path_info)
        route = ROUTES.get(match.url_name)
        if route is None:
            return None
        request.get_host()  # ALLOWED_HOSTS
    except (Resolver404, DisallowedHost, UnicodeDecodeError, ValueError):
        return None
    meta = request.META  # repeated headers joined, as DRF sees them
    if meta.get("HTTP_ACCEPT", "") not in _ACCEPTED:
        return None
    if len(body) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE or meta.get("CONTENT_TYPE") not in _JSON_TYPES:
        return None
    if meta.get("CONTENT_LENGTH") != str(len(body)):  # DRF reads Content-Length bytes (none without one)
        return None
    if _middleware[0].process_request(request) is not None:  # SecurityMiddleware: the HTTPS redirect
        return None
    run_id = int(match.kwargs["run_id"])
    try:
        token = ingest_token(request)
    except exceptions.AuthenticationFailed:
        return None
    if token is None or token.run_id != run_id:
        return None
    try:
        data = _parser.parse(io.BytesIO(body), "application/json", {})
    except (exceptions.ParseError, exceptions.ValidationError):
        return None
    n = wire.batch_length(data, wire.ITEMS[route.endpoint])
    if n is not None and n > wire.LIMITS[route.endpoint]:
        return None
    try:
        batch = wire.parse(route.body, data)
    except wire.WireError:
        return None
    if not IngestThrottle().allow_ingest_token(token.pk):
        return None
    reply = route.store(run_id, batch)
    response = HttpResponse(
        _renderer.render(reply.model_dump(mode="json")), content_type="application/json", status=route.status
    )
    for name, value in _VIEW_HEADERS[route.view].items():
        if name == "Vary":
            patch_vary_headers(response, [value])
        else:
            response[name] = value
    for middleware in reversed(_middleware):
        response = middleware.process_response(request, response)
    return response


def _serve_in_thread(scope: Scope, body: bytes) -> HttpResponse | None:
    try:
        return serve(scope, body)
    except Exception:
        log.warning("ingestion front: handing the request to Django after an error", exc_info=True)
        connection.close()  # a broken connection is not reused; the next request opens another
        return None


class IngestFront:
    """ASGI middleware: metrics and samples POSTs by a run's own ingest token are served by ``serve``;
    everything else, and whatever ``serve`` declines, goes to ``app`` unchanged."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        self._pools: dict[asyncio.AbstractEventLoop, ThreadPoolExecutor] = {}
        self._started: dict[asyncio.AbstractEventLoop, list[int]] = {}  # the threads each pool started

    def _pool(self, loop: asyncio.AbstractEventLoop) -> ThreadPoolExecutor:
        pool = self._pools.get(loop)
        if pool is None:
            started = self._started[loop] = []

            def start_thread() -> None:
                live.bind_loop(loop)
                started.append(threading.get_ident())

            pool = self._pools[loop] = ThreadPoolExecutor(
                THREADS, thread_name_prefix="ingest", initializer=start_thread
            )
        return pool

    def close(self) -> None:
        """Close the threads' database connections and stop the threads (a server exiting, a test)."""
        for loop, pool in self._pools.items():
            n = len(
                self._started.get(loop, ())
            )  # each thread takes exactly one close (they wait for each other)
            barrier = threading.Barrier(n) if n else None

            def close_one(barrier: threading.Barrier | None = barrier) -> None:
                connections.close_all()
                if barrier is not None:
                    barrier.wait(timeout=30)

            for future in [pool.submit(close_one) for _ in range(n)]:
                future.result()
            pool.shutdown(wait=True)
        self._pools.clear()
        self._started.clear()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith(_PATH_ENDS):
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        size, limit = 0, settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away before its body arrived (Django's handler does the same)
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if not more or size > limit:
                break
        body = b"".join(chunks)
        response = None
        if not more:
            loop = asyncio.get_running_loop()
            response = await loop.run_in_executor(self._pool(loop), _serve_in_thread, scope, body)
        if response is None:
            return await self.app(scope, _replay(body, more, receive), send)
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.items()],
            }
        )
        await send({"type": "http.response.body", "body": response.content})


def _replay(body: bytes, more: bool, receive: Receive) -> Receive:
    """``receive`` with the body read so far delivered first (as one message)."""
    pending = [{"type": "http.request", "body": body, "more_body": more}]

    async def replayed() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return replayed


_VIEW_HEADERS = {route.view: _view_headers(route.view) for route in ROUTES.values()}

"""The ingestion front (tracking/ingest.py) through ASGI: a run's own ingest token gets its metrics or
samples batch stored with the answer Django gives (status, body, headers), without Django's request cycle; every
other request reaches the Django application with its body and gets Django's own answer. Real database
(transactional: the front stores from its own threads), real throttle counters and live bus."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.db import connections
from django.utils import timezone

from accounts.models import ApiToken
from accounts.services import ingest_token_issue, token_create
from config.asgi import django_asgi_app
from experiments.services import run_create
from rl_engine import wire
from tracking import services
from tracking.bus import live_bus
from tracking.ingest import IngestFront
from tracking.models import MetricPoint, Sample

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


class Recorder:
    """The Django application, recording the paths it was asked to answer."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope, receive, send) -> None:
        self.paths.append(scope["path"])
        await django_asgi_app(scope, receive, send)


@pytest_asyncio.fixture
async def front():
    django = Recorder()
    app = IngestFront(django)
    yield app, django
    await sync_to_async(app.close, thread_sensitive=False)()
    await sync_to_async(connections.close_all)()


@pytest.fixture
def world(team, experiment):
    runs = [run_create(experiment=experiment, user=None) for _ in range(4)]
    issued = [ingest_token_issue(run=r) for r in runs]
    ApiToken.objects.filter(pk=issued[2].token.pk).update(revoked_at=timezone.now())
    ApiToken.objects.filter(pk=issued[3].token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    return {
        "runs": runs,
        "ingest": [i.secret for i in issued],
        "user_token": token_create(user=team["member"], name="script").secret,
    }


def batch(step0: int, n: int = 30, value: float = 1.0) -> dict[str, Any]:
    return {"points": [{"key": f"k/{i % 3}", "step": step0 + i // 3, "value": value + i, "wall_time": 1.5}
                       for i in range(n)]}  # fmt: skip


async def call(app, path: str, body: bytes, token: str | None = None, chunks: int = 1, **headers: str):
    """POST ``body`` (in ``chunks`` messages) to ``app``; (status, headers, body) of the answer."""
    hdrs = {
        "host": "localhost",
        "content-type": "application/json",
        "content-length": str(len(body)),
        **headers,
    }
    if token:
        hdrs["authorization"] = f"Token {token}"
    pairs = [(k, v) for k, v in hdrs.items() if v and k != "accept"]
    pairs += [("accept", v) for v in hdrs.get("accept", "").split("|") if v]  # "a|b": the header twice
    path, _, query = path.partition("?")
    scope = {"type": "http", "http_version": "1.1", "method": "POST", "path": path, "raw_path": path.encode(),
             "query_string": query.encode(), "root_path": "", "scheme": "http", "server": ("127.0.0.1", 8000),
             "client": ("127.0.0.1", 40000), "headers": [(k.encode(), v.encode()) for k, v in pairs]}  # fmt: skip
    comm = ApplicationCommunicator(app, scope)
    size = -(-len(body) // chunks) if body else 0
    parts = [body[i : i + size] for i in range(0, len(body), size)] if body else [b""]
    for i, part in enumerate(parts):
        await comm.send_input({"type": "http.request", "body": part, "more_body": i < len(parts) - 1})
    start = await comm.receive_output(10)
    assert start["type"] == "http.response.start", start
    out = b""
    while True:
        msg = await comm.receive_output(10)
        out += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    await comm.wait(10)
    return start["status"], sorted((k.decode().lower(), v.decode()) for k, v in start["headers"]), out


def stored(run_id: int) -> set[tuple[str, int, float]]:
    return set(MetricPoint.objects.filter(run_id=run_id).values_list("key", "step", "value"))


def sent(*bodies: dict[str, Any]) -> set[tuple[str, int, float]]:
    first: dict[tuple[str, int], float] = {}
    for b in bodies:
        for p in b["points"]:
            first.setdefault((p["key"], p["step"]), p["value"])  # the first value stored wins
    return {(k, s, v) for (k, s), v in first.items()}


async def test_a_runs_own_token_is_served_by_the_front_with_djangos_answer(front, world):
    app, django = front
    run, token = world["runs"][0], world["ingest"][0]
    url = f"/api/runs/{run.pk}/metrics"
    a, b = batch(0), batch(100)
    lean = await call(app, url, json.dumps(a).encode(), token)
    assert django.paths == []  # the front answered alone
    full = await call(django_asgi_app, url, json.dumps(b).encode(), token)
    assert lean == full  # status, every header, body
    assert lean[0] == 200 and json.loads(lean[2]) == {"received": 30, "inserted": 30}
    assert await sync_to_async(stored)(run.pk) == sent(a, b)


def samples(step: int, batch_id: str | None = None, n: int = 3) -> dict[str, Any]:
    body: dict[str, Any] = {"step": step, "samples": [{"prompt": f"p{i}", "response": "r", "reward": 0.5}
                                                      for i in range(n)]}  # fmt: skip
    if batch_id:
        body["batch_id"] = batch_id
    return body


async def test_a_runs_own_samples_are_served_by_the_front_with_djangos_answer(front, world):
    app, django = front
    run, token = world["runs"][0], world["ingest"][0]
    url = f"/api/runs/{run.pk}/samples"
    lean = await call(app, url, json.dumps(samples(1, "batch-1")).encode(), token)
    assert django.paths == []  # the front answered alone
    full = await call(django_asgi_app, url, json.dumps(samples(2, "batch-2")).encode(), token)
    assert lean == full  # status, every header, body
    assert lean[0] == 201 and json.loads(lean[2]) == {"received": 3, "stored": 3}
    again = await call(app, url, json.dumps(samples(1, "batch-1")).encode(), token)  # a resent batch
    assert again == lean and django.paths == []
    count = sync_to_async(lambda: Sample.objects.filter(run=run).count())
    assert await count() == 6  # nothing stored twice


async def test_a_retried_batch_stores_nothing_twice_and_the_first_value_wins(front, world):
    app, django = front
    run, token = world["runs"][0], world["ingest"][0]
    url = f"/api/runs/{run.pk}/metrics"
    first, retry = batch(0, value=1.0), batch(0, value=9.0)
    assert json.loads((await call(app, url, json.dumps(first).encode(), token))[2])["inserted"] == 30
    again = await call(app, url, json.dumps(retry).encode(), token)
    assert json.loads(again[2]) == {"received": 30, "inserted": 0}
    assert django.paths == []
    assert await sync_to_async(stored)(run.pk) == sent(first)


async def test_a_body_in_several_messages_is_read_whole(front, world):
    app, django = front
    run, token = world["runs"][0], world["ingest"][0]
    body = batch(0, n=300)
    status, _, answer = await call(
        app, f"/api/runs/{run.pk}/metrics", json.dumps(body).encode(), token, chunks=7
    )
    assert (status, json.loads(answer)) == (200, {"received": 300, "inserted": 300})
    assert django.paths == []
    assert await sync_to_async(stored)(run.pk) == sent(body)


def _refused_cases(world: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Requests the front must hand to Django: (what, call arguments)."""
    run = world["runs"][0]
    url = f"/api/runs/{run.pk}/metrics"
    ok = json.dumps(batch(0)).encode()
    point = {"key": "k", "step": 1, "value": 1.0, "wall_time": 0.0}
    return [
        ("malformed JSON", {"path": url, "body": b'{"points": [', "token": world["ingest"][0]}),
        ("not an object", {"path": url, "body": b"[1, 2]", "token": world["ingest"][0]}),
        (
            "a bad value",
            {
                "path": url,
                "body": json.dumps({"points": [point | {"value": "x"}]}).encode(),
                "token": world["ingest"][0],
            },
        ),
        (
            "an unknown field",
            {
                "path": url,
                "body": json.dumps({"points": [point], "extra": 1}).encode(),
                "token": world["ingest"][0],
            },
        ),
        (
            "a NUL in a key",
            {
                "path": url,
                "body": json.dumps({"points": [point | {"key": "a\x00"}]}).encode(),
                "token": world["ingest"][0],
            },
        ),
        (
            "a negative step",
            {
                "path": url,
                "body": json.dumps({"points": [point | {"step": -1}]}).encode(),
                "token": world["ingest"][0],
            },
        ),
        (
            "over the batch limit",
            {
                "path": url,
                "token": world["ingest"][0],
                "body": json.dumps({"points": [point] * (wire.MAX_POINTS_PER_BATCH + 1)}).encode(),
            },
        ),
        ("no credentials", {"path": url, "body": ok}),
        ("an unknown token", {"path": url, "body": ok, "token": "not-a-token"}),
        ("another run's token", {"path": url, "body": ok, "token": world["ingest"][1]}),
        (
            "a revoked token",
            {"path": f"/api/runs/{world['runs'][2].pk}/metrics", "body": ok, "token": world["ingest"][2]},
        ),
        (
            "an expired token",
            {"path": f"/api/runs/{world['runs'][3].pk}/metrics", "body": ok, "token": world["ingest"][3]},
        ),
        ("unknown run", {"path": "/api/runs/999999/metrics", "body": ok, "token": world["ingest"][0]}),
        (
            "a form body",
            {
                "path": url,
                "body": b"points=1",
                "token": world["ingest"][0],
                "content-type": "application/x-www-form-urlencoded",
            },
        ),
        ("HTML wanted", {"path": url, "body": ok, "token": world["ingest"][0], "accept": "text/html"}),
        (
            "HTML wanted, twice",
            {"path": url, "body": ok, "token": world["ingest"][0], "accept": "text/html|*/*"},
        ),
        ("a format override", {"path": url + "?format=json", "body": ok, "token": world["ingest"][0]}),
        ("a disallowed host", {"path": url, "body": ok, "token": world["ingest"][0], "host": "evil.example"}),
        (
            "no Content-Length (chunked)",
            {"path": url, "body": ok, "token": world["ingest"][0], "content-length": ""},
        ),
        (
            "another endpoint",
            {"path": f"/api/runs/{run.pk}/events", "body": b'{"events": []}', "token": world["ingest"][0]},
        ),
        (
            "samples: one without a step",
            {
                "path": f"/api/runs/{run.pk}/samples",
                "body": json.dumps({"samples": [{"prompt": "p", "response": "r"}]}).encode(),
                "token": world["ingest"][0],
            },
        ),
        (
            "samples: over the batch limit",
            {
                "path": f"/api/runs/{run.pk}/samples",
                "body": json.dumps(samples(1, n=wire.MAX_SAMPLES_PER_BATCH + 1)).encode(),
                "token": world["ingest"][0],
            },
        ),
        (
            "samples: another run's token",
            {
                "path": f"/api/runs/{run.pk}/samples",
                "body": json.dumps(samples(1)).encode(),
                "token": world["ingest"][1],
            },
        ),
    ]


async def test_every_other_request_gets_djangos_own_answer(front, world):
    app, django = front
    cases = await sync_to_async(_refused_cases)(world)
    for what, kwargs in cases:
        kwargs = dict(kwargs)
        args = (kwargs.pop("path"), kwargs.pop("body"), kwargs.pop("token", None))
        django.paths.clear()
        through_front = await call(app, *args, **kwargs)
        assert django.paths == [args[0].partition("?")[0]], what  # handed over, body and all
        direct = await call(django_asgi_app, *args, **kwargs)
        assert through_front[0] >= 400 or what in (
            "a format override",
            "HTML wanted",
            "HTML wanted, twice",
            "another endpoint",
        ), what
        assert through_front[0] == direct[0], what
        if through_front[0] >= 400:
            assert through_front == direct, what  # the same error body and headers
    assert await sync_to_async(MetricPoint.objects.count)() == 30  # the accepted ones carried the same batch


async def test_a_user_token_is_answered_by_django(front, world):
    app, django = front
    run = world["runs"][0]
    body = batch(0)
    status, _, answer = await call(
        app, f"/api/runs/{run.pk}/metrics", json.dumps(body).encode(), world["user_token"]
    )
    assert (status, json.loads(answer)) == (200, {"received": 30, "inserted": 30})
    assert django.paths == [f"/api/runs/{run.pk}/metrics"]
    assert await sync_to_async(stored)(run.pk) == sent(body)


async def test_a_throttled_token_gets_djangos_429(front, world, settings):
    app, django = front
    current = dict(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"])
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {**current, "ingest": "2/hour"},
    }
    run, token = world["runs"][0], world["ingest"][0]
    url = f"/api/runs/{run.pk}/metrics"
    assert [(await call(app, url, json.dumps(batch(10 * i)).encode(), token))[0] for i in range(2)] == [
        200,
        200,
    ]
    assert django.paths == []
    status, headers, _ = await call(app, url, json.dumps(batch(50)).encode(), token)
    assert status == 429 and int(dict(headers)["retry-after"]) >= 1
    assert django.paths == [url]
    assert await sync_to_async(stored)(run.pk) == sent(batch(0), batch(10))


async def test_an_error_while_storing_hands_the_request_to_django_which_stores_it_once(
    front, world, monkeypatch
):
    app, django = front
    run, token = world["runs"][0], world["ingest"][0]
    real, failures = services.metrics_ingest, []

    def fail_once(**kwargs):
        if not failures:
            failures.append(1)
            real(**kwargs)  # stored, and then the connection broke
            raise RuntimeError("connection lost")
        return real(**kwargs)

    monkeypatch.setattr(services, "metrics_ingest", fail_once)
    body = batch(0)
    status, _, answer = await call(app, f"/api/runs/{run.pk}/metrics", json.dumps(body).encode(), token)
    assert status == 200 and json.loads(answer) == {"received": 30, "inserted": 0}  # already there
    assert django.paths == [f"/api/runs/{run.pk}/metrics"]
    assert await sync_to_async(stored)(run.pk) == sent(body)


async def test_the_fronts_stored_points_are_published_to_the_runs_followers(front, world):
    app, _ = front
    run, token = world["runs"][0], world["ingest"][0]
    reader = live_bus().reader()  # what a web process's hub listens with
    await reader.reopen({run.pk})
    body = batch(0, n=6)
    try:
        assert (await call(app, f"/api/runs/{run.pk}/metrics", json.dumps(body).encode(), token))[0] == 200
        envelope = (await asyncio.wait_for(reader.receive(), 10))[0]
    finally:
        await reader.close()
    assert envelope.run_id == run.pk and envelope.kind == "metrics"
    series = json.loads(envelope.text)["series"]
    got = {(k, s, v) for k, ser in series.items() for s, v in zip(ser["steps"], ser["values"], strict=True)}
    assert got == sent(body)


async def test_with_the_throttle_counters_store_away_the_front_still_stores(front, world, settings, tmp_path):
    """The ingest throttle lets a run's own token through while its store (a private Redis, killed) is
    away: the front stores and answers alone, with no detour through Django and no 500."""
    from harness.private_redis import PrivateRedis, require_redis_server

    require_redis_server()
    server = PrivateRedis(tmp_path)
    server.start()
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": server.url,
            "KEY_PREFIX": "front-outage",
        }
    }
    app, django = front
    run, token = world["runs"][0], world["ingest"][0]
    url = f"/api/runs/{run.pk}/metrics"
    try:
        assert (await call(app, url, json.dumps(batch(0)).encode(), token))[0] == 200
        server.stop()
        status, _, body = await call(app, url, json.dumps(batch(100)).encode(), token)
        assert status == 200 and json.loads(body) == {"received": 30, "inserted": 30}
        assert django.paths == []
        assert await sync_to_async(stored)(run.pk) == sent(batch(0), batch(100))
    finally:
        server.stop()


@pytest.mark.parametrize("chunks", [1, 3])
async def test_the_front_serves_a_body_exactly_when_djangos_upload_limit_admits_it(
    front, world, settings, chunks
):
    """Django refuses a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes (a 413) and reads one of exactly
    that size. Around the boundary (the limit one byte under, at and over the body's size), the front
    answers alone exactly when Django, asked directly with the same request, stores it; otherwise it
    hands the request over, and the answer is Django's 413."""
    app, django = front
    run, token = world["runs"][0], world["ingest"][0]
    url = f"/api/runs/{run.pk}/metrics"
    steps = iter(range(1000, 9000, 100))  # same number of digits: every body below has the same size
    size = len(json.dumps(batch(next(steps))).encode())
    for limit in (size - 2, size - 1, size, size + 1, size + 2):
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE = limit
        direct = await call(django_asgi_app, url, json.dumps(batch(next(steps))).encode(), token)
        admitted = direct[0] == 200  # Django's own rule, asked directly
        assert admitted == (size <= limit) and (admitted or direct[0] == 413), (limit, direct)
        django.paths.clear()
        body = json.dumps(batch(next(steps))).encode()
        assert len(body) == size
        through_front = await call(app, url, body, token, chunks=chunks)
        assert (django.paths == []) == admitted, (limit, size)  # served alone exactly when admitted
        assert through_front[0] == direct[0], (limit, through_front)
        if not admitted:
            assert through_front == direct  # Django's own 413, body and headers

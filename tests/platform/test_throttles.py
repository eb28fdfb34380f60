"""Rate limits on login, token creation and ingestion: beyond the configured rate a 429 with Retry-After;
counted per client (address and username, user, run's ingest token), so one client never throttles
another. Rates are settings; the tests lower them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import ApiToken
from accounts.services import ingest_token_issue
from accounts.throttles import FixedWindowThrottle, HeartbeatThrottle, IngestThrottle
from experiments.services import run_create
from tests.platform.conftest import client_for


@pytest.fixture
def rates(settings, monkeypatch):
    """Lower the rates, and stop the throttles' clock 30 s into a minute (and an hour): windows are aligned
    to the wall clock, so a test whose requests straddled a boundary would start a fresh count midway."""
    monkeypatch.setattr(FixedWindowThrottle, "timer", staticmethod(lambda: 1_800_000_030.0))

    def set_rates(**rates: str) -> None:
        current = dict(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"])
        settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {**current, **rates}}

    return set_rates


def assert_throttled(resp) -> None:
    assert resp.status_code == 429, resp.content[:300]
    assert int(resp["Retry-After"]) >= 1


def login(client: Client, username: str, password: str = "wrong", url: str = "/accounts/login/", **extra):
    return client.post(url, {"username": username, "password": password}, **extra)


def test_login_attempts_beyond_the_rate_are_429_with_retry_after(team, rates):
    rates(login="3/minute", login_address="100/minute")
    browser = Client()
    assert [login(browser, "member").status_code for _ in range(3)] == [200, 200, 200]  # wrong password
    refused = login(browser, "member", password="pw-for-tests")  # even the right one, now
    assert_throttled(refused)
    assert b"Too many login attempts" in refused.content
    assert login(browser, "viewer", password="pw-for-tests").status_code == 302  # another account: fine
    other_address = login(Client(), "member", password="pw-for-tests", REMOTE_ADDR="10.0.0.7")
    assert other_address.status_code == 302


def test_a_compatibility_spelling_of_the_name_counts_against_the_same_account(team, rates):
    """Authentication reads a full-width ``member`` as ``member`` (NFKC): so does the throttle."""
    rates(login="3/minute", login_address="100/minute")
    browser = Client()
    for name in ("member", "MEMBER", "\uff4d\uff45\uff4d\uff42\uff45\uff52"):
        assert login(browser, name).status_code == 200
    assert_throttled(login(browser, "\uff2d\uff25\uff2d\uff22\uff25\uff32", password="pw-for-tests"))
    assert_throttled(login(browser, "member", password="pw-for-tests"))


def test_one_address_trying_many_usernames_is_throttled_too(team, rates):
    rates(login="100/minute", login_address="3/minute")
    browser = Client()
    for name in ("a", "b", "c"):
        assert login(browser, name).status_code == 200
    assert_throttled(login(browser, "d"))


def test_a_spoofed_forwarded_for_header_does_not_reset_the_count(team, rates):
    rates(login="2/minute", login_address="100/minute")
    browser = Client()
    for i in range(2):
        login(browser, "member", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}")
    assert_throttled(login(browser, "member", HTTP_X_FORWARDED_FOR="192.0.2.99"))


def test_the_admin_login_is_throttled_too(team, rates):
    rates(login="2/minute", login_address="100/minute")
    browser = Client()
    for _ in range(2):
        assert login(browser, "member", url="/admin/login/").status_code == 200
    assert_throttled(login(browser, "member", url="/admin/login/"))


def test_token_creation_beyond_the_rate_is_429_per_user(team, rates):
    rates(token_create="2/hour")
    member = client_for(team["member"])
    for i in range(2):
        assert member.post("/api/tokens", {"name": f"t{i}"}, format="json").status_code == 201
    assert_throttled(member.post("/api/tokens", {"name": "t3"}, format="json"))
    assert member.get("/api/tokens").status_code == 200  # listing is not creating
    assert client_for(team["owner"]).post("/api/tokens", {"name": "o"}, format="json").status_code == 201


def test_ingestion_beyond_the_rate_is_429_per_run_token(team, experiment, rates):
    rates(ingest="3/hour")
    runs = [run_create(experiment=experiment, user=None) for _ in range(2)]
    engines = [client_for(token=ingest_token_issue(run=r).secret) for r in runs]
    point = {"points": [{"key": "k", "step": 1, "value": 1.0, "wall_time": 0.0}]}
    first = f"/api/runs/{runs[0].pk}"
    assert engines[0].post(f"{first}/metrics", point, format="json").status_code == 200
    assert engines[0].post(f"{first}/events", {"events": []}, format="json").status_code == 201
    assert engines[0].post(f"{first}/samples", {"step": 1, "samples": []}, format="json").status_code == 201
    assert_throttled(engines[0].post(f"{first}/metrics", point, format="json"))
    assert engines[1].post(f"/api/runs/{runs[1].pk}/metrics", point, format="json").status_code == 200
    assert client_for(team["viewer"]).get(f"{first}/metrics").status_code == 200  # reads are not ingestion


def test_the_default_ingest_rate_leaves_ample_room_for_a_real_engine():
    """An engine posts a batch about every 100 ms (metrics, events, samples, heartbeat: ~10-20 requests a
    second) and drains its spool back-to-back after an outage; the default must never throttle that."""
    throttle = IngestThrottle()
    assert throttle.num_requests / throttle.duration >= 200


def test_heartbeats_have_their_own_bucket_so_a_throttled_backlog_never_lets_the_token_expire(
    experiment, rates
):
    """The ingest token lives on heartbeats (it expires after the heartbeat timeout unless renewed): an
    engine draining a backlog at the ingest rate must still get its heartbeats through."""
    rates(ingest="2/hour", heartbeat="3/hour")
    run = run_create(experiment=experiment, user=None)  # queued: active, so heartbeats renew its token
    issued = ingest_token_issue(run=run)
    engine, url = client_for(token=issued.secret), f"/api/runs/{run.pk}"
    point = {"points": [{"key": "k", "step": 1, "value": 1.0, "wall_time": 0.0}]}
    assert (
        engine.post(f"{url}/heartbeat").status_code == 200
    )  # a heartbeat takes nothing from the data's rate
    assert [engine.post(f"{url}/metrics", point, format="json").status_code for _ in range(2)] == [200, 200]
    assert_throttled(engine.post(f"{url}/metrics", point, format="json"))  # the backlog waits...
    soon = timezone.now() + timedelta(seconds=2)
    ApiToken.objects.filter(pk=issued.token.pk).update(expires_at=soon)  # ...and the token nears its end
    assert engine.post(f"{url}/heartbeat").status_code == 200  # still renewed
    assert ApiToken.objects.get(pk=issued.token.pk).expires_at > soon + timedelta(seconds=30)
    assert engine.post(f"{url}/heartbeat").status_code == 200
    assert_throttled(engine.post(f"{url}/heartbeat"))  # heartbeats have a rate of their own


def test_the_default_heartbeat_rate_leaves_room_for_an_engine_and_its_retries():
    """The sink beats every 1-10 s (RL_ENGINE_HEARTBEAT_S) plus one due beat after a 429."""
    throttle = HeartbeatThrottle()
    assert throttle.num_requests / throttle.duration >= 2


def test_on_redis_the_throttle_counts_with_one_pipelined_round_trip_not_the_cache_api(redis_url, monkeypatch):
    """DRF's throttles hold ``django.core.cache.cache``, a proxy: the counter must still take the Redis path
    (SET NX EX + INCR in one pipeline), never the cache API's add and incr (3 round trips, and a Redis
    connection opened per request under ASGI)."""
    import redis as redis_lib
    from django.core.cache import cache as default_cache
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    from accounts.throttles import count_in_window

    assert isinstance(caches["default"], RedisCache)
    monkeypatch.setattr(RedisCache, "add", lambda *a, **k: pytest.fail("took the cache API's add"))
    monkeypatch.setattr(RedisCache, "incr", lambda *a, **k: pytest.fail("took the cache API's incr"))
    executed = []
    real_execute = redis_lib.client.Pipeline.execute
    monkeypatch.setattr(
        redis_lib.client.Pipeline,
        "execute",
        lambda self, *a, **k: executed.append(1) or real_execute(self, *a, **k),
    )
    key = "throttle-test:window"
    assert [count_in_window(default_cache, key, 30) for _ in range(5)] == [1, 2, 3, 4, 5]
    assert len(executed) == 5  # one round trip each
    full = caches["default"].make_and_validate_key(key)
    ttl = redis_lib.Redis.from_url(redis_url).ttl(full)
    assert 0 < ttl <= 30  # the window's key expires


@pytest.fixture
def private_cache(settings, tmp_path):
    """The throttle counters in a private Redis (the shared one is never stopped): (server, stop, start)."""
    from harness.private_redis import PrivateRedis, require_redis_server

    require_redis_server()
    server = PrivateRedis(tmp_path)
    server.start()
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": server.url,
            "KEY_PREFIX": "throttle-outage",
        }
    }
    yield server
    server.stop()


def test_with_the_counters_store_away_ingestion_goes_through_and_login_and_tokens_answer_503(
    team, experiment, private_cache
):
    """A real outage (the private Redis killed): the engine's posts are stored, never a 500; login and
    token creation, whose rates are the point, are refused with 503 and Retry-After until it is back."""
    from tracking.models import MetricPoint, RunEvent

    run = run_create(experiment=experiment, user=None)
    engine, url = client_for(token=ingest_token_issue(run=run).secret), f"/api/runs/{run.pk}"
    member = client_for(team["member"])

    def point(step: int) -> dict:
        return {"points": [{"key": "k", "step": step, "value": 1.0, "wall_time": 0.0}]}

    assert engine.post(f"{url}/metrics", point(0), format="json").status_code == 200
    private_cache.stop()
    assert engine.post(f"{url}/metrics", point(1), format="json").status_code == 200
    event = {"events": [{"kind": "log", "message": "during the outage", "data": {}}]}
    assert engine.post(f"{url}/events", event, format="json").status_code == 201
    assert engine.post(f"{url}/samples", {"step": 1, "samples": []}, format="json").status_code == 201
    assert engine.post(f"{url}/heartbeat").status_code == 200
    assert set(MetricPoint.objects.filter(run=run).values_list("step", flat=True)) == {0, 1}
    assert RunEvent.objects.filter(run=run, message="during the outage").exists()

    refused = member.post("/api/tokens", {"name": "t"}, format="json")
    assert refused.status_code == 503 and int(refused["Retry-After"]) >= 1, refused.content[:300]
    assert "rate-limit store" in refused.json()["detail"]
    for login_url in ("/accounts/login/", "/admin/login/"):
        away = login(Client(), "member", password="pw-for-tests", url=login_url)
        assert away.status_code == 503 and int(away["Retry-After"]) >= 1, login_url
        assert b"try again in" in away.content
    assert not ApiToken.objects.filter(user=team["member"], name="t").exists()

    private_cache.start()  # same port, empty
    assert member.post("/api/tokens", {"name": "t"}, format="json").status_code == 201
    assert login(Client(), "member", password="pw-for-tests").status_code == 302

"""``POST /api/tokens/login``: a user token for a username and password, without a browser session (what
``rlp login`` uses). The password is checked and kept nowhere; a wrong password, an unknown and an
inactive account get the same answer; attempts count against the login page's limits (the same counters:
the web form and the API share one budget per address and username), token creation against the user's
rate; while the throttle store (Redis) does not answer, the login is refused with 503 and Retry-After
rather than let through uncounted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken
from tests.factories import UserFactory
from tests.platform.conftest import client_for
from tests.platform.test_throttles import assert_throttled, login, rates  # noqa: F401 (rates: a fixture)

PASSWORD = "pw-for-tests"  # what UserFactory sets
URL = "/api/tokens/login"


def token_login(username: str, password: str = PASSWORD, client: APIClient | None = None, **body):
    return (client or APIClient()).post(
        URL, {"username": username, "password": password, **body}, format="json"
    )


def test_the_right_password_gets_a_token_that_acts_as_the_user_and_nothing_else_is_kept(team):
    resp = token_login("member", name="laptop")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["username"] == "member" and body["name"] == "laptop" and body["kind"] == "user"
    assert body["project"] is None and body["parent"] is None
    assert PASSWORD not in resp.content.decode()
    assert not resp.cookies  # no session, no CSRF cookie: the token is the only credential made
    me = client_for(token=body["secret"]).get("/api/me")
    assert me.status_code == 200 and me.json()["username"] == "member"
    token = ApiToken.objects.get(pk=body["id"])
    assert token.user == team["member"] and token.key_hash != body["secret"]
    assert body["secret"] not in str(ApiToken.objects.filter(pk=token.pk).values().get())


def test_an_expiry_is_kept_and_one_in_the_past_is_a_400(team):
    later = timezone.now() + timedelta(days=3)
    resp = token_login("member", expires_at=later.isoformat())
    assert resp.status_code == 201 and ApiToken.objects.get(pk=resp.json()["id"]).expires_at == later
    resp = token_login("member", expires_at=(timezone.now() - timedelta(days=1)).isoformat())
    assert resp.status_code == 400 and list(resp.json()["errors"]) == ["expires_at"]


def test_a_wrong_password_an_unknown_and_an_inactive_account_get_the_same_401(team):
    UserFactory(username="gone", is_active=False)
    tokens_before = ApiToken.objects.count()
    answers = [token_login("member", "wrong"), token_login("nobody"), token_login("gone")]
    assert {r.status_code for r in answers} == {401}
    assert len({r.content for r in answers}) == 1, [r.content for r in answers]
    assert answers[0].json() == {"detail": "Wrong username or password."}
    assert ApiToken.objects.count() == tokens_before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"password": PASSWORD}, "username"),
        ({"username": "member"}, "password"),
        ({"username": "member", "password": "x" * 5000}, "password"),
        ({"username": ["member"], "password": PASSWORD}, "username"),
        ({"username": "member", "password": PASSWORD, "name": "n" * 101}, "name"),
    ],
)
def test_a_malformed_body_is_a_400_naming_the_field(team, body, field):
    resp = APIClient().post(URL, body, format="json")
    assert resp.status_code == 400 and field in resp.json()["errors"], resp.content


def test_a_session_or_a_token_header_is_ignored_the_body_decides(team):
    """No session authentication: a logged-in browser needs no CSRF token here, and gains nothing."""
    browser = APIClient(enforce_csrf_checks=True)
    browser.force_login(team["owner"])
    resp = token_login("member", client=browser)
    assert resp.status_code == 201 and resp.json()["username"] == "member"
    stale = APIClient()
    stale.credentials(HTTP_AUTHORIZATION="Token rlp_revoked_or_unknown")
    assert token_login("member", client=stale).status_code == 201


def test_attempts_beyond_the_login_rate_are_429_per_address_and_username(team, rates):  # noqa: F811
    rates(login="3/minute", login_address="100/minute")
    assert [token_login("member", "wrong").status_code for _ in range(3)] == [401, 401, 401]
    assert_throttled(token_login("member"))  # even the right password, now
    assert_throttled(token_login("MEMBER"))  # the name as authentication reads it
    assert token_login("viewer").status_code == 201  # another account: fine
    assert token_login("member", client=APIClient(REMOTE_ADDR="10.0.0.7")).status_code == 201


def test_the_login_page_and_the_api_count_in_one_budget(team, rates):  # noqa: F811
    """Alternating between the form and the API gives a password guesser no more attempts."""
    rates(login="3/minute", login_address="100/minute")
    browser = Client()
    assert [login(browser, "member").status_code for _ in range(2)] == [200, 200]  # wrong password
    assert token_login("member", "wrong").status_code == 401
    assert_throttled(token_login("member"))
    assert_throttled(login(browser, "member", password=PASSWORD))


def test_one_address_trying_many_usernames_is_throttled(team, rates):  # noqa: F811
    rates(login="100/minute", login_address="3/minute")
    for name in ("a", "b", "c"):
        assert token_login(name).status_code == 401
    assert_throttled(token_login("member"))


def test_tokens_made_by_logging_in_count_against_the_users_token_rate(team, rates):  # noqa: F811
    rates(token_create="2/hour")
    assert [token_login("member").status_code for _ in range(2)] == [201, 201]
    assert_throttled(token_login("member"))
    member = client_for(team["member"])
    assert_throttled(
        member.post("/api/tokens", {"name": "t"}, format="json")
    )  # one budget with POST /api/tokens
    assert token_login("owner").status_code == 201


def test_while_the_throttle_store_is_away_a_login_is_503_with_retry_after(team, settings, tmp_path):
    """The cache's Redis killed: no token is made uncounted; once it is back, logging in works again."""
    from harness.private_redis import PrivateRedis, require_redis_server

    require_redis_server()
    redis = PrivateRedis(tmp_path)
    redis.start()
    try:
        settings.CACHES = {
            "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis.url}
        }
        assert token_login("member").status_code == 201
        redis.stop()
        tokens_before = ApiToken.objects.count()
        resp = token_login("member")
        assert resp.status_code == 503, resp.content
        assert int(resp["Retry-After"]) >= 1 and "try again" in resp.json()["detail"]
        assert ApiToken.objects.count() == tokens_before
        redis.start()
        assert token_login("member").status_code == 201
    finally:
        redis.stop()


def test_a_login_token_expires_by_default_within_the_lifetime_and_never_later(team, settings):
    settings.LOGIN_TOKEN_LIFETIME_DAYS = 7
    before = timezone.now()
    token = ApiToken.objects.get(pk=token_login("member").json()["id"])
    assert before + timedelta(days=7) <= token.expires_at <= timezone.now() + timedelta(days=7)
    asked = timezone.now() + timedelta(days=365)  # asking for longer gets the lifetime
    capped = ApiToken.objects.get(pk=token_login("member", expires_at=asked.isoformat()).json()["id"])
    assert capped.expires_at <= timezone.now() + timedelta(days=7)


def test_a_login_token_creates_no_tokens_but_a_browser_sessions_token_may(team):
    body = token_login("member").json()
    assert body["can_create_tokens"] is False
    child = client_for(token=body["secret"]).post("/api/tokens", {"name": "child"}, format="json")
    assert child.status_code == 400 and "password login" in str(child.json()), child.json()
    assert not ApiToken.objects.filter(name="child").exists()
    made = client_for(team["member"]).post("/api/tokens", {"name": "from the browser"}, format="json")
    assert made.status_code == 201 and made.json()["can_create_tokens"] is True


def test_a_password_change_revokes_the_users_tokens(team):
    """As a password change ends the user's live streams: whoever held the old password may have made
    them. Another user's tokens stay."""
    mine = [token_login("member").json()["secret"] for _ in range(2)]
    browser = client_for(team["member"]).post("/api/tokens", {"name": "b"}, format="json").json()["secret"]
    other = token_login("viewer").json()["secret"]
    for secret in [*mine, browser, other]:
        assert client_for(token=secret).get("/api/me").status_code == 200
    user = team["member"]
    user.set_password("a-new-password-2026")
    user.save()
    for secret in [*mine, browser]:
        assert client_for(token=secret).get("/api/me").status_code == 401
    assert client_for(token=other).get("/api/me").status_code == 200
    user.first_name = "M"  # a save that leaves the password alone revokes nothing new
    user.save()
    assert token_login("member", "a-new-password-2026").status_code == 201
    fresh = ApiToken.objects.filter(user=user, revoked_at__isnull=True)
    user.save()
    assert ApiToken.objects.filter(user=user, revoked_at__isnull=True).count() == fresh.count() == 1

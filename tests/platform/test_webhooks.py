"""Project webhooks: the SSRF guard at creation and at delivery, signed JSON POSTs to a real local HTTP
receiver, retries with backoff (in-process attempts, and a real Celery worker against a receiver that is
down, then up), the delivery log and the API."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest

from alerts.delivery import attempt, backoff_s
from alerts.models import AlertKind, DeliveryStatus, Webhook, WebhookDelivery
from alerts.services import alert_raise
from experiments.services import run_create
from tests.conftest import SESSION_DELIVERY_QUEUE, SESSION_QUEUE, start_celery_worker, wait_for
from tests.factories import ExperimentFactory
from tests.platform.conftest import client_for
from tests.platform.webhook_receiver import Receiver, free_port

SECRET = "s3cret-for-the-tests-0123456789"


@pytest.fixture
def receiver():
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def loopback_allowed(settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.WEBHOOK_RETRY_BASE_S = 0.1
    return settings


@pytest.fixture
def run(team):
    exp = ExperimentFactory(project=team["project"], created_by=team["member"])
    return run_create(experiment=exp, user=team["member"])


def _hook(team, url, **kw) -> Webhook:
    return Webhook.objects.create(project=team["project"], url=url, secret=SECRET, **kw)


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """What a receiver does (docs/api.md, "Webhooks"): HMAC-SHA256 of "<timestamp>.<body>"."""
    mac = hmac.new(secret.encode(), headers["x-rlp-timestamp"].encode() + b"." + body, hashlib.sha256)
    return hmac.compare_digest(headers["x-rlp-signature"], "sha256=" + mac.hexdigest())


# --- the SSRF guard -------------------------------------------------------------------------------------

REFUSED = [
    ("http://127.0.0.1:{port}/hook", "loopback"),
    ("http://localhost:{port}/hook", "loopback"),  # a name that resolves to loopback
    ("http://[::1]:{port}/", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://10.1.2.3/hook", "private"),
    ("http://192.168.0.10/hook", "private"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://1.1.1.1/", "platform's own services"),  # PLATFORM_URL below
    ("ftp://example.org/file", "scheme"),
    ("file:///etc/passwd", "scheme"),
    ("http://user:pw@93.184.216.34/", "credentials"),
    ("http:///nohost", "no host"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("url,why", REFUSED, ids=[u for u, _ in REFUSED])
def test_a_refused_url_is_a_400_at_creation(team, settings, url, why):
    settings.PLATFORM_URL = "http://1.1.1.1:8000"
    body = {"project": team["project"].pk, "url": url.format(port=free_port())}
    resp = client_for(team["owner"]).post("/api/webhooks", body, format="json")
    assert resp.status_code == 400, resp.content
    assert why in resp.json()["errors"]["url"][0]
    assert not Webhook.objects.exists()


@pytest.mark.django_db
def test_the_administrators_setting_allows_a_host_and_a_public_address_needs_none(team, settings):
    owner = client_for(team["owner"])
    body = {"project": team["project"].pk, "url": "http://127.0.0.1:9/hook"}
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    assert owner.post("/api/webhooks", body, format="json").status_code == 201
    localhost = owner.post("/api/webhooks", {**body, "url": "http://localhost:9/"}, format="json")
    assert localhost.status_code == 400  # the setting names hosts verbatim: 127.0.0.1 is not localhost
    public = owner.post("/api/webhooks", {**body, "url": "https://93.184.216.34/x"}, format="json")
    assert public.status_code == 201


@pytest.mark.django_db
def test_a_url_refused_now_is_refused_again_at_delivery(team, run, loopback_allowed, receiver):
    hook = _hook(team, receiver.url)  # allowed when created
    named = _hook(team, receiver.url.replace("127.0.0.1", "localhost"))  # stored before a rule change
    raised = alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="stalled")
    assert raised.opened
    loopback_allowed.WEBHOOK_ALLOWED_HOSTS = []
    for delivery in WebhookDelivery.objects.filter(webhook__in=[hook, named]):
        assert attempt(delivery.pk).status == DeliveryStatus.REFUSED
        delivery.refresh_from_db()
        assert delivery.status == DeliveryStatus.REFUSED and "loopback" in delivery.last_error
        assert attempt(delivery.pk).status == "not claimable"  # refused is final: never retried
    assert receiver.received == []


# --- delivery -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_delivery_is_a_signed_json_post_with_the_documented_payload(team, run, loopback_allowed, receiver):
    hook = _hook(team, receiver.url)
    alert = alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="stalled rollout").alert
    delivery = WebhookDelivery.objects.get(webhook=hook)
    assert attempt(delivery.pk).status == DeliveryStatus.SUCCEEDED
    [got] = receiver.received
    assert got.path == "/hook?source=rlp"
    assert got.headers["content-type"] == "application/json"
    assert got.headers["host"] == f"127.0.0.1:{receiver.port}"
    assert verify(SECRET, got.headers, got.body)
    assert not verify("another secret", got.headers, got.body)
    assert not verify(SECRET, got.headers, got.body.replace(b"stalled", b"Stalled"))
    assert abs(int(got.headers["x-rlp-timestamp"]) - time.time()) < 60
    payload = json.loads(got.body)
    assert got.headers["x-rlp-delivery"] == payload["delivery_id"] == str(delivery.delivery_id)
    assert payload["event"] == got.headers["x-rlp-event"] == "alert.opened"
    assert payload["alert"]["id"] == alert.pk and payload["alert"]["kind"] == "engine"
    assert payload["alert"]["message"] == "stalled rollout" and payload["alert"]["count"] == 1
    assert {"first_seen", "last_seen", "rule", "detail"} <= set(payload["alert"])
    assert payload["run"]["id"] == run.pk and payload["run"]["url"].endswith(f"/runs/{run.pk}/")
    assert payload["project"] == {"id": team["project"].pk, "name": team["project"].name}
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.status_code) == (DeliveryStatus.SUCCEEDED, 1, 200)
    assert attempt(delivery.pk).status == "not claimable" and len(receiver.received) == 1


@pytest.mark.django_db
def test_only_a_new_alert_is_delivered_to_active_hooks_that_take_its_kind(
    team, run, loopback_allowed, receiver
):
    every = _hook(team, receiver.url)
    failures_only = _hook(team, receiver.url, events=["run_failed"])
    _hook(team, receiver.url, active=False)
    alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="a")
    alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="again")  # a repeat: no new delivery
    assert list(WebhookDelivery.objects.values_list("webhook_id", flat=True)) == [every.pk]
    alert_raise(run_id=run.pk, kind=AlertKind.RUN_FAILED, message="boom")
    assert WebhookDelivery.objects.filter(webhook=failures_only).count() == 1


@pytest.mark.django_db
def test_failed_attempts_back_off_and_a_redirect_is_not_followed(team, run, loopback_allowed, receiver):
    loopback_allowed.WEBHOOK_MAX_ATTEMPTS = 3
    hook = _hook(team, receiver.url)
    alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="a")
    delivery = WebhookDelivery.objects.get(webhook=hook)
    receiver.status, receiver.location = 302, "http://169.254.169.254/"
    first = attempt(delivery.pk)
    assert (first.status, first.retry_in) == (DeliveryStatus.RETRYING, backoff_s(1)) and backoff_s(1) == 0.1
    delivery.refresh_from_db()
    assert delivery.status_code == 302 and "redirects are not followed" in delivery.last_error
    receiver.status, receiver.location = 500, ""
    assert attempt(delivery.pk).retry_in == pytest.approx(0.2)  # doubled
    assert attempt(delivery.pk).status == DeliveryStatus.FAILED  # the third and last attempt
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == (DeliveryStatus.FAILED, 3, "HTTP 500")
    assert len(receiver.received) == 3  # each attempt once; the redirect's target never asked


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_receiver_down_for_a_while_gets_the_alert_once_when_it_is_up(
    team, run, tmp_path, monkeypatch, request
):
    """The Celery path end to end: the delivery is enqueued on commit, a real worker attempts it while
    nothing listens, backs off, and delivers once the receiver is up."""
    from config.celery import app

    # Django's settings are loaded before tests/conftest.py names the session's queue (so the app's
    # default queue here is "celery"): route explicitly, as the launcher's tests do, so that this worker,
    # and only it, gets the task (the router is built once: rebuild it for the new table).
    previous = app.conf.task_routes
    app.conf.task_routes = {
        **(previous or {}),
        "alerts.*": {"queue": SESSION_QUEUE},
        "alerts.deliver_webhook": {"queue": SESSION_DELIVERY_QUEUE},  # the deliveries' own queue
    }
    app.amqp.flush_routes()
    monkeypatch.setattr(app.amqp, "router", app.amqp.Router())
    request.addfinalizer(lambda: (setattr(app.conf, "task_routes", previous), app.amqp.flush_routes()))
    port = free_port()
    worker = start_celery_worker(
        tmp_path,
        concurrency=2,
        env_overrides={
            "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
            "WEBHOOK_RETRY_BASE_S": "0.3",
            "WEBHOOK_RETRY_MAX_S": "1",
            "WEBHOOK_TIMEOUT_S": "2",
        },
    )
    receiver = Receiver(port=port)
    try:
        hook = _hook(team, receiver.url)
        alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="stalled")  # autocommit: enqueued now
        wait_for(
            lambda: WebhookDelivery.objects.filter(webhook=hook, attempts__gte=2).exists(),
            timeout_s=30,
            message="two failed attempts while the receiver is down: " + worker.log()[-3000:],
        )
        receiver.start()
        delivery = wait_for(
            lambda: WebhookDelivery.objects.filter(webhook=hook, status=DeliveryStatus.SUCCEEDED).first(),
            timeout_s=30,
            message="the delivery to succeed once the receiver is up",
        )
        time.sleep(1.5)  # long enough for a stray duplicate attempt to arrive
        ids = [json.loads(r.body)["delivery_id"] for r in receiver.received]
        assert ids == [str(delivery.delivery_id)], worker.log()[-3000:]
        assert delivery.attempts >= 3  # two refused while down (at least), then the one that arrived
    finally:
        receiver.stop()
        worker.stop()


# --- API ------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_webhooks_are_an_owners_business_and_the_secret_is_shown_once(team, run, loopback_allowed, receiver):
    owner, member = client_for(team["owner"]), client_for(team["member"])
    body = {"project": team["project"].pk, "url": receiver.url, "events": ["engine", "rule"]}
    assert member.post("/api/webhooks", body, format="json").status_code == 403
    resp = owner.post("/api/webhooks", body, format="json")
    assert resp.status_code == 201, resp.content
    created = resp.json()
    assert len(created["secret"]) >= 32 and created["events"] == ["engine", "rule"]
    hook_id = created["id"]
    assert "secret" not in owner.get(f"/api/webhooks/{hook_id}").json()
    assert member.get(f"/api/webhooks/{hook_id}").status_code == 403
    assert member.get("/api/webhooks").json()["count"] == 0
    assert owner.get("/api/webhooks").json()["count"] == 1
    chosen = owner.post("/api/webhooks", {**body, "secret": SECRET}, format="json").json()
    assert chosen["secret"] == SECRET
    for field, value in (("events", ["nope"]), ("secret", "short"), ("url", "gopher://x/"), ("url", "")):
        resp = owner.post("/api/webhooks", {**body, field: value}, format="json")
        assert resp.status_code == 400 and field in resp.json()["errors"], (field, resp.content)
    resp = owner.patch(f"/api/webhooks/{hook_id}", {"url": "http://169.254.169.254/"}, format="json")
    assert resp.status_code == 400 and "link-local" in resp.json()["errors"]["url"][0]
    moved = owner.patch(f"/api/webhooks/{hook_id}", {"project": team["other_project"].pk}, format="json")
    assert moved.status_code == 400 and "project" in moved.json()["errors"]
    same = owner.patch(f"/api/webhooks/{hook_id}", {"project": team["project"].pk}, format="json")
    assert same.status_code == 200
    assert owner.patch(f"/api/webhooks/{hook_id}", {"active": False}, format="json").json()["active"] is False
    owner.patch(f"/api/webhooks/{hook_id}", {"active": True}, format="json")
    alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="a")
    deliveries = owner.get(f"/api/webhooks/{hook_id}/deliveries").json()
    assert deliveries["count"] == 1 and deliveries["results"][0]["status"] == "pending"
    assert member.get(f"/api/webhooks/{hook_id}/deliveries").status_code == 403
    assert owner.delete(f"/api/webhooks/{hook_id}").status_code == 204


@pytest.mark.django_db
def test_the_webhook_list_answers_each_webhooks_latest_delivery(team, run, loopback_allowed, receiver):
    owner = client_for(team["owner"])
    hook = _hook(team, receiver.url)
    quiet = _hook(team, receiver.url, events=["rule"])
    listed = lambda: {h["id"]: h["last_delivery"] for h in owner.get("/api/webhooks").json()["results"]}  # noqa: E731
    assert listed() == {hook.pk: None, quiet.pk: None}
    alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="a")
    first = WebhookDelivery.objects.get(webhook=hook)
    assert attempt(first.pk).status == DeliveryStatus.SUCCEEDED
    alert_raise(run_id=run.pk, kind=AlertKind.RUN_FAILED, message="b")  # a newer one, still pending
    latest = WebhookDelivery.objects.filter(webhook=hook).latest("pk")
    assert latest.pk != first.pk
    got = listed()
    assert got[quiet.pk] is None
    assert got[hook.pk]["status"] == "pending" and got[hook.pk]["attempts"] == 0
    receiver.status = 503
    assert attempt(latest.pk).status == DeliveryStatus.RETRYING
    detail = owner.get(f"/api/webhooks/{hook.pk}").json()["last_delivery"]
    assert (detail["status"], detail["attempts"], detail["status_code"]) == ("retrying", 1, 503)
    patched = owner.patch(f"/api/webhooks/{hook.pk}", {"active": False}, format="json").json()
    assert patched["last_delivery"] == detail  # not annotated there: read once

"""Webhook attempts whose countdown task was lost: the beat sweep (``alerts.resend_due_deliveries``)
enqueues them again, numbered, and a real local HTTP receiver gets each delivery exactly once however
many copies of the attempt (the lost task arriving late, two sweeps, a redelivered earlier attempt)
race for it."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from alerts import delivery as delivery_mod
from alerts.delivery import attempt, deliver_webhook, resend_due
from alerts.models import AlertKind, DeliveryStatus, Webhook, WebhookDelivery
from alerts.services import alert_raise
from experiments.services import run_create
from tests.conftest import SESSION_DELIVERY_QUEUE, SESSION_QUEUE, start_celery_worker, wait_for
from tests.factories import ExperimentFactory
from tests.platform.webhook_receiver import Receiver, free_port

SECRET = "s3cret-for-the-tests-0123456789"


@pytest.fixture
def settings_for_sweep(settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.WEBHOOK_RETRY_BASE_S = 0.1
    settings.WEBHOOK_SWEEP_INTERVAL_S = 1.0
    settings.WEBHOOK_TIMEOUT_S = 2.0
    return settings


@pytest.fixture
def run(team):
    exp = ExperimentFactory(project=team["project"], created_by=team["member"])
    return run_create(experiment=exp, user=team["member"])


@pytest.fixture
def enqueued(monkeypatch) -> list[tuple]:
    """What the code enqueues (task arguments), held here instead of the broker: a test decides which
    messages get lost and which arrive, and when."""
    sent: list[tuple] = []
    monkeypatch.setattr(deliver_webhook, "apply_async", lambda args, **kw: sent.append(tuple(args)))
    return sent


def _race(messages: list[tuple]) -> list[str]:
    """Run the task body for each message at once, each in its own thread (its own DB connection), as
    concurrent workers would."""
    barrier = threading.Barrier(len(messages))
    out: list[str] = [""] * len(messages)

    def work(i: int, args: tuple) -> None:
        try:
            barrier.wait()
            out[i] = deliver_webhook.run(*args)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(i, m)) for i, m in enumerate(messages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


@pytest.mark.django_db(transaction=True)
def test_an_attempt_whose_countdown_task_was_lost_is_delivered_exactly_once(
    team, run, settings_for_sweep, enqueued
):
    port = free_port()
    receiver = Receiver(port=port)  # down: nothing listens on the port yet
    hook = Webhook.objects.create(project=team["project"], url=receiver.url, secret=SECRET)
    alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="stalled")
    delivery = WebhookDelivery.objects.get(webhook=hook)
    assert delivery.next_attempt_at is not None and delivery.status == DeliveryStatus.PENDING

    assert deliver_webhook.run(delivery.pk, 1) == DeliveryStatus.RETRYING  # connection refused
    assert enqueued == [(delivery.pk, 2)]  # the countdown task for attempt 2 ...
    lost = enqueued.pop()  # ... which the broker loses (a worker killed while holding it)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.RETRYING, 1)
    assert "Connection" in delivery.last_error or "refused" in delivery.last_error.lower()
    wait = (delivery.next_attempt_at - delivery.updated).total_seconds()
    assert 0.05 < wait < 0.5  # backoff_s(1) = the base, 0.1 s

    assert resend_due().resent == []  # due, but not yet overdue by the sweep's interval: left alone
    receiver.start()
    try:
        later = timezone.now() + timedelta(seconds=2)
        first, second = resend_due(later), resend_due(later)  # two beat passes before a worker runs one
        assert first.resent == second.resent == [(delivery.pk, 2)]
        assert enqueued == [(delivery.pk, 2), (delivery.pk, 2)]
        redelivered_dead_attempt = (delivery.pk, 1)  # the broker hands the first attempt out again
        outcomes = _race([lost, *enqueued, redelivered_dead_attempt])
        assert sorted(outcomes) == sorted([DeliveryStatus.SUCCEEDED] + ["not claimable"] * 3), outcomes
        time.sleep(0.2)
        ids = [json.loads(r.body)["delivery_id"] for r in receiver.received]
        assert ids == [str(delivery.delivery_id)]
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts, delivery.status_code) == (
            DeliveryStatus.SUCCEEDED,
            2,
            200,
        )
        assert delivery.next_attempt_at is None
        assert resend_due(later + timedelta(hours=1)).resent == []  # finished: never swept again
    finally:
        receiver.stop()


@pytest.mark.django_db
def test_an_attempt_is_never_made_before_it_is_due_nor_twice(team, run, settings_for_sweep, enqueued):
    settings_for_sweep.WEBHOOK_RETRY_BASE_S = 60.0
    receiver = Receiver(port=free_port())
    hook = Webhook.objects.create(project=team["project"], url=receiver.url, secret=SECRET)
    alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="stalled")
    delivery = WebhookDelivery.objects.get(webhook=hook)
    assert attempt(delivery.pk, 2).status == "not claimable"  # attempt 1 comes first
    assert attempt(delivery.pk, 1).status == DeliveryStatus.RETRYING
    assert attempt(delivery.pk, 1).status == "not claimable"  # made already
    assert attempt(delivery.pk, 2).status == "not claimable"  # due in 60 s, not now
    assert attempt(delivery.pk).status == "not claimable"  # an unnumbered (older) message: not due either
    assert resend_due(timezone.now() + timedelta(seconds=30)).resent == []
    assert resend_due(timezone.now() + timedelta(seconds=62)).resent == [(delivery.pk, 2)]
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and delivery.status == DeliveryStatus.RETRYING


@pytest.mark.django_db
def test_an_attempt_abandoned_by_a_dead_worker_is_followed_by_the_next_or_ends_the_delivery(
    team, run, settings_for_sweep, enqueued
):
    settings_for_sweep.WEBHOOK_MAX_ATTEMPTS = 3
    receiver = Receiver().start()
    try:
        hook = Webhook.objects.create(project=team["project"], url=receiver.url, secret=SECRET)
        alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="a")
        alert_raise(run_id=run.pk, kind=AlertKind.RUN_FAILED, message="b")
        mid, last = WebhookDelivery.objects.filter(webhook=hook).order_by("pk")
        past = timezone.now() - timedelta(seconds=1)
        # Their workers died mid-request (kill -9): the rows stay "sending" until the lease runs out.
        WebhookDelivery.objects.filter(pk=mid.pk).update(status="sending", attempts=1, lease_until=past)
        WebhookDelivery.objects.filter(pk=last.pk).update(status="sending", attempts=3, lease_until=past)
        in_flight = WebhookDelivery.objects.filter(pk=mid.pk)
        swept = resend_due()
        assert swept.resent == [(mid.pk, 2)] and swept.failed == [last.pk]
        assert attempt(mid.pk, 1).status == "not claimable"  # the dead attempt's message, redelivered
        assert attempt(*swept.resent[0]).status == DeliveryStatus.SUCCEEDED
        assert in_flight.get().attempts == 2
        last.refresh_from_db()
        assert last.status == DeliveryStatus.FAILED and "stopped" in last.last_error
        assert [json.loads(r.body)["delivery_id"] for r in receiver.received] == [str(mid.delivery_id)]
        assert resend_due(timezone.now() + timedelta(hours=1)) == delivery_mod.Swept(resent=[], failed=[])
    finally:
        receiver.stop()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_while_holding_the_countdown_the_next_worker_delivers_once(
    team, run, tmp_path, monkeypatch, request
):
    """The real path: a worker with embedded beat holds the retry's countdown message and is killed
    (kill -9); the message stays with the broker (Redis: unacknowledged for the visibility timeout, an
    hour; the file broker: gone). A new worker's beat sweep sends the attempt, once."""
    from config.celery import app

    previous = app.conf.task_routes  # route to this session's worker (see test_webhooks.py)
    app.conf.task_routes = {
        **(previous or {}),
        "alerts.*": {"queue": SESSION_QUEUE},
        "alerts.deliver_webhook": {"queue": SESSION_DELIVERY_QUEUE},  # the deliveries' own queue
    }
    app.amqp.flush_routes()
    monkeypatch.setattr(app.amqp, "router", app.amqp.Router())
    request.addfinalizer(lambda: (setattr(app.conf, "task_routes", previous), app.amqp.flush_routes()))
    env = {
        "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
        "WEBHOOK_RETRY_BASE_S": "4",
        "WEBHOOK_SWEEP_INTERVAL_S": "1",
        "WEBHOOK_TIMEOUT_S": "2",
        "ALERT_RULES_INTERVAL_S": "0",
    }
    beat = ["-B", "-s", str(tmp_path / "beat-schedule")]
    receiver = Receiver(port=free_port())
    worker = start_celery_worker(tmp_path, concurrency=2, env_overrides=env, extra_args=beat)
    try:
        hook = Webhook.objects.create(project=team["project"], url=receiver.url, secret=SECRET)
        alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="stalled")
        rows = WebhookDelivery.objects.filter(webhook=hook)
        wait_for(
            lambda: rows.filter(status=DeliveryStatus.RETRYING, attempts=1).exists(),
            timeout_s=30,
            message="the first attempt to fail: " + worker.log()[-3000:],
        )
        worker.kill()  # holds the countdown of attempt 2
        receiver.start()
        worker = start_celery_worker(tmp_path, concurrency=2, env_overrides=env, extra_args=beat)
        delivered = wait_for(
            lambda: rows.filter(status=DeliveryStatus.SUCCEEDED).first(),
            timeout_s=40,
            message="the sweep to send the lost attempt: " + worker.log()[-3000:],
        )
        time.sleep(2.5)  # two more sweeps: nothing more may arrive
        ids = [json.loads(r.body)["delivery_id"] for r in receiver.received]
        assert ids == [str(delivered.delivery_id)] and delivered.attempts == 2
        assert "resend_due_deliveries" in worker.log()
    finally:
        receiver.stop()
        worker.stop()

"""Webhook attempts whose countdown task was lost: the beat sweep (``alerts.resend_due_deliveries``)
enqueues them again, numbered, and a real local HTTP receiver gets each delivery exactly once however
many copies of the attempt (the lost task arriving late, two sweeps, a redelivered earlier attempt)
race for it."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from alerts import delivery as delivery_mod
from alerts.delivery import attempt, deliver_webhook, resend_due
from alerts.models import Alert, AlertKind, DeliveryStatus, Webhook, WebhookDelivery
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


@pytest.fixture
def receiver_up():
    receiver = Receiver().start()
    yield receiver
    receiver.stop()


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


# --- any interleaving of attempts, dead workers, passing time and sweeps, against a model ---------------


@dataclass
class Model:
    """A delivery as the documented rules say it evolves (docs/api.md, "Webhooks"; alerts/delivery.py):
    attempts are numbered 1..max; an attempt is made only as the one after those made, only when the
    delivery is due (or the attempt in flight outlived its lease: its worker died), never beyond max;
    an attempt in flight holds the delivery for as long as its request may take (connect and read
    timeouts) and more."""

    max_attempts: int
    attempts: int = 0
    status: str = DeliveryStatus.PENDING
    due: bool = True  # pending or retrying, and due (overdue for the sweep, too)
    lease_live: bool = False  # sending: its worker may still be sending
    posts: int = 0  # requests the receiver got

    def claimable(self, number: int | None) -> bool:
        waiting = self.status in (DeliveryStatus.PENDING, DeliveryStatus.RETRYING) and self.due
        abandoned = self.status == DeliveryStatus.SENDING and not self.lease_live
        return (
            (waiting or abandoned)
            and self.attempts < self.max_attempts
            and (number is None or number == self.attempts + 1)
        )

    def claim(self) -> None:
        self.attempts += 1
        self.status, self.due, self.lease_live = DeliveryStatus.SENDING, False, True

    def answered(self, ok: bool) -> str:
        self.posts += 1
        self.lease_live = False
        if ok:
            self.status = DeliveryStatus.SUCCEEDED
        else:
            failed = self.attempts >= self.max_attempts
            self.status = DeliveryStatus.FAILED if failed else DeliveryStatus.RETRYING
        return self.status


# (op, argument): "send" an attempt's message (unnumbered, or numbered around the next attempt's number)
# that the receiver answers with 200 or 500; "dies": a worker claims that attempt and is killed before
# its request;
# "due": time passes until the retry is due; "lease": the lease of an attempt in flight runs out;
# "sweep": a beat pass, at a moment up to the longest an attempt's request may take; "queued": the
# oldest message the code enqueued (a retry's countdown, a sweep's resend) arrives.
NUMBER = st.one_of(st.none(), st.integers(-1, 1))  # unnumbered, or the next attempt's number -1, +0, +1
OP = st.one_of(
    st.tuples(st.just("send"), st.tuples(NUMBER, st.booleans())),
    st.tuples(st.just("dies"), NUMBER),
    st.tuples(st.just("due"), st.none()),
    st.tuples(st.just("lease"), st.none()),
    st.tuples(st.just("sweep"), st.sampled_from([0.0, 0.5, 1.0])),  # times 2 * WEBHOOK_TIMEOUT_S
    st.tuples(st.just("queued"), st.booleans()),
)


@pytest.mark.django_db
@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(max_attempts=st.integers(1, 3), ops=st.lists(OP, min_size=1, max_size=12))
# Edge cases the search reaches rarely: the worker of the last attempt died, its lease ran out; then an
# unnumbered message, and one numbered as the attempt after the last, arrive.
@example(max_attempts=1, ops=[("dies", 0), ("lease", None), ("send", (None, True))])
@example(
    max_attempts=2, ops=[("dies", 0), ("lease", None), ("dies", None), ("lease", None), ("send", (0, True))]
)
def test_any_interleaving_of_attempts_dead_workers_and_sweeps_follows_the_model(
    team, run, settings_for_sweep, enqueued, receiver_up, max_attempts, ops
):
    """Each step's outcome, the delivery's stored attempts and status, and the requests the receiver got
    are the model's: never an attempt beyond WEBHOOK_MAX_ATTEMPTS (also for a dead worker's last
    attempt, whatever message arrives), never a second claim of an attempt in flight within the time its
    request may take, each attempt's request made once."""
    settings_for_sweep.WEBHOOK_MAX_ATTEMPTS = max_attempts
    settings_for_sweep.WEBHOOK_RETRY_BASE_S = 600.0  # a retry is due only when a step says so
    timeout = float(settings_for_sweep.WEBHOOK_TIMEOUT_S)
    hook = Webhook.objects.create(project=team["project"], url=receiver_up.url, secret=SECRET)
    alert = Alert.objects.first() or alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="m").alert
    WebhookDelivery.objects.all().delete()  # an earlier example's: the sweep sees this one only
    delivery = WebhookDelivery.objects.create(webhook=hook, alert=alert, payload={"event": "test"})
    row = WebhookDelivery.objects.filter(pk=delivery.pk)
    long_ago = timezone.now() - timedelta(minutes=10)
    row.update(next_attempt_at=long_ago, updated=long_ago)  # due, and overdue for the sweep
    enqueued.clear()
    receiver_up.received.clear()
    model = Model(max_attempts)

    def send(number: int | None, ok: bool) -> None:
        receiver_up.status = 200 if ok else 500
        before = len(enqueued)
        want = "not claimable"
        if model.claimable(number):
            model.claim()
            want = model.answered(ok)
        assert deliver_webhook.run(delivery.pk, number) == want, (number, ok)
        if want == DeliveryStatus.RETRYING:  # its countdown message, for the next attempt
            assert enqueued[before:] == [(delivery.pk, model.attempts + 1)]
        else:
            assert enqueued[before:] == []

    def number(offset: int | None) -> int | None:
        return None if offset is None else model.attempts + 1 + offset

    for op, arg in ops:
        now = timezone.now()
        if op == "send":
            send(number(arg[0]), arg[1])
        elif op == "dies":
            n = number(arg)
            claimed = model.claimable(n)
            if claimed:
                model.claim()
            assert delivery_mod._claim(delivery.pk, n) == claimed, n
        elif op == "due":
            if model.status in (DeliveryStatus.PENDING, DeliveryStatus.RETRYING):
                model.due = True
            row.filter(status__in=[DeliveryStatus.PENDING, DeliveryStatus.RETRYING]).update(
                next_attempt_at=now - timedelta(minutes=10)
            )
        elif op == "lease":
            model.lease_live = False
            row.filter(status=DeliveryStatus.SENDING).update(lease_until=now - timedelta(seconds=1))
        elif op == "sweep":
            want = delivery_mod.Swept(resent=[], failed=[])
            if model.status == DeliveryStatus.SENDING and not model.lease_live:
                if model.attempts >= max_attempts:
                    model.status = DeliveryStatus.FAILED
                    want.failed.append(delivery.pk)
                else:
                    want.resent.append((delivery.pk, model.attempts + 1))
            elif model.status in (DeliveryStatus.PENDING, DeliveryStatus.RETRYING) and model.due:
                want.resent.append((delivery.pk, model.attempts + 1))
            before = len(enqueued)
            assert resend_due(now + timedelta(seconds=arg * 2 * timeout)) == want, (op, arg)
            assert enqueued[before:] == want.resent
        elif op == "queued" and enqueued:
            send(*enqueued.pop(0)[1:], arg)
        stored = row.get()
        assert (stored.attempts, stored.status) == (model.attempts, model.status), (op, arg)
        assert len(receiver_up.received) == model.posts <= max_attempts
        assert {r.headers["x-rlp-delivery"] for r in receiver_up.received} <= {str(delivery.delivery_id)}

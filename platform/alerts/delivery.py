"""Delivering an alert to a webhook: one signed JSON POST per attempt, retried with exponential backoff.

Each attempt re-checks the URL (alerts/url_guard.py) and connects to the address that check approved,
with the URL's host name as the Host header and as TLS SNI and certificate name; redirects are not
followed. The body is the delivery's frozen payload; the headers (docs/api.md, "Webhooks"):

- ``X-RLP-Delivery``: the delivery's id, the receiver's idempotency key (also ``delivery_id`` in the body);
- ``X-RLP-Timestamp``: Unix seconds of this attempt;
- ``X-RLP-Signature``: ``sha256=`` + hex HMAC-SHA256, keyed with the webhook's secret, of
  ``<timestamp>.<body>`` (the timestamp header, a dot, the raw body bytes).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import urllib3
from celery import shared_task
from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from alerts import url_guard
from alerts.models import DeliveryStatus, WebhookDelivery

log = logging.getLogger(__name__)

USER_AGENT = "rl-platform-webhooks/1"
ERROR_MAX = 2000


def signature(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def body_bytes(payload: dict) -> bytes:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


def backoff_s(attempts: int) -> float:
    """Wait after failed attempt number ``attempts`` (1, 2, ...)."""
    base = float(settings.WEBHOOK_RETRY_BASE_S)
    return min(base * 2 ** max(0, attempts - 1), float(settings.WEBHOOK_RETRY_MAX_S))


def post(target: url_guard.Target, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    """POST ``body`` to the checked address of ``target``; the answer's status (no redirects followed)."""
    timeout = urllib3.Timeout(connect=timeout_s, read=timeout_s)
    pool: urllib3.HTTPConnectionPool
    if target.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            target.address,
            target.port,
            timeout=timeout,
            retries=False,
            maxsize=1,
            cert_reqs="CERT_REQUIRED",
            server_hostname=target.host,
            assert_hostname=target.host,
        )
    else:
        pool = urllib3.HTTPConnectionPool(
            target.address, target.port, timeout=timeout, retries=False, maxsize=1
        )
    try:
        resp = pool.urlopen(
            "POST",
            target.path,
            body=body,
            headers={**headers, "Host": target.host_header},
            redirect=False,
            retries=False,
            preload_content=False,
        )
        resp.read(64 * 1024)  # a little of the answer; the rest is never read
        resp.release_conn()
        return resp.status
    finally:
        pool.close()


@dataclass(frozen=True)
class Outcome:
    status: str
    retry_in: float | None = None
    next_number: int | None = None  # the attempt to make after ``retry_in`` seconds


# A countdown task may run this much before the due time its worker stored (clocks of two workers).
CLOCK_SLACK = timedelta(seconds=1)


def _claim(delivery_id: int, number: int | None) -> bool:
    """Take the delivery for attempt ``number`` (counting it): only if that is the attempt after the
    ones made, the delivery is due (or an attempt in flight has outlived its lease: its worker died) and
    attempts are left. ``number`` None (a message queued before attempts were numbered): the next one.
    One conditional UPDATE, so of two tasks for the same attempt exactly one gets it."""
    now = timezone.now()
    lease = now + timedelta(seconds=float(settings.WEBHOOK_TIMEOUT_S) * 2 + 30)
    due = Q(status__in=[DeliveryStatus.PENDING, DeliveryStatus.RETRYING]) & (
        Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now + CLOCK_SLACK)
    )
    abandoned = Q(status=DeliveryStatus.SENDING, lease_until__lt=now)
    rows = WebhookDelivery.objects.filter(
        due | abandoned, pk=delivery_id, attempts__lt=int(settings.WEBHOOK_MAX_ATTEMPTS)
    )
    if number is not None:
        rows = rows.filter(attempts=number - 1)
    return bool(
        rows.update(
            status=DeliveryStatus.SENDING,
            attempts=F("attempts") + 1,
            lease_until=lease,
            next_attempt_at=None,
            updated=now,
        )
    )


def _finish(delivery: WebhookDelivery, status: str, **fields) -> None:
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        status=status, lease_until=None, updated=timezone.now(), **fields
    )


def attempt(delivery_id: int, number: int | None = None) -> Outcome:
    """Attempt ``number`` of a delivery (idempotent: a finished delivery, one being attempted, one not
    due yet or an attempt already made is left as it is). Says when to try again, if it should be."""
    if not _claim(delivery_id, number):
        return Outcome("not claimable")
    delivery = WebhookDelivery.objects.select_related("webhook").get(pk=delivery_id)
    hook = delivery.webhook
    if not hook.active:
        _finish(delivery, DeliveryStatus.FAILED, last_error="the webhook was deactivated")
        return Outcome(DeliveryStatus.FAILED)
    try:
        target = url_guard.check(hook.url)
    except url_guard.UrlRefused as exc:
        _finish(delivery, DeliveryStatus.REFUSED, last_error=f"url {exc}"[:ERROR_MAX])
        return Outcome(DeliveryStatus.REFUSED)
    body = body_bytes(delivery.payload)
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-RLP-Delivery": str(delivery.delivery_id),
        "X-RLP-Event": str(delivery.payload.get("event", "")),
        "X-RLP-Timestamp": timestamp,
        "X-RLP-Signature": signature(hook.secret, timestamp, body),
    }
    code: int | None = None
    try:
        code = post(target, body, headers, float(settings.WEBHOOK_TIMEOUT_S))
        error = (
            ""
            if 200 <= code < 300
            else f"HTTP {code}" + (" (redirects are not followed)" if 300 <= code < 400 else "")
        )
    except Exception as exc:  # connection refused, timeout, TLS: all a failed attempt
        error = f"{type(exc).__name__}: {exc}"
    if not error:
        _finish(
            delivery, DeliveryStatus.SUCCEEDED, status_code=code, last_error="", delivered_at=timezone.now()
        )
        return Outcome(DeliveryStatus.SUCCEEDED)
    attempts = delivery.attempts
    if attempts >= int(settings.WEBHOOK_MAX_ATTEMPTS):
        _finish(delivery, DeliveryStatus.FAILED, status_code=code, last_error=error[:ERROR_MAX])
        return Outcome(DeliveryStatus.FAILED)
    wait = backoff_s(attempts)
    _finish(
        delivery,
        DeliveryStatus.RETRYING,
        status_code=code,
        last_error=error[:ERROR_MAX],
        next_attempt_at=timezone.now() + timedelta(seconds=wait),
    )
    return Outcome(DeliveryStatus.RETRYING, retry_in=wait, next_number=attempts + 1)


@shared_task(name="alerts.deliver_webhook", acks_late=True)
def deliver_webhook(delivery_id: int, number: int | None = None) -> str:
    """Attempt ``number`` of a delivery; after a failed attempt, enqueue the next one after its backoff
    (a message a worker holds until then: should it be lost, ``resend_due_deliveries`` sends it)."""
    outcome = attempt(delivery_id, number)
    if outcome.retry_in is not None:
        log.info("webhook delivery %s failed; next attempt in %.1fs", delivery_id, outcome.retry_in)
        deliver_webhook.apply_async((delivery_id, outcome.next_number), countdown=outcome.retry_in)
    return outcome.status


# --- the sweep: attempts whose countdown task was lost -----------------------------------------------

SWEEP_BATCH = 500  # deliveries re-sent per pass at most (the most overdue first)


@dataclass(frozen=True)
class Swept:
    resent: list[tuple[int, int]]  # (delivery pk, attempt number) enqueued again
    failed: list[int]  # abandoned on their last attempt (its worker died): failed


def resend_due(now: datetime | None = None) -> Swept:
    """Enqueue again the attempts overdue by more than ``WEBHOOK_SWEEP_INTERVAL_S`` (their countdown
    task was lost: a worker killed while holding it, a broker restart, an enqueue that failed after the
    alert's commit) and the next attempt of deliveries whose attempt in flight outlived its lease (its
    worker died mid-request). Each message names its attempt number: whichever of the lost task's late
    arrival, this message or a second sweep's comes first makes the attempt, the others find it made."""
    now = now or timezone.now()
    grace = timedelta(seconds=max(float(settings.WEBHOOK_SWEEP_INTERVAL_S), 1.0))
    overdue = Q(status__in=[DeliveryStatus.PENDING, DeliveryStatus.RETRYING]) & (
        Q(next_attempt_at__lte=now - grace) | Q(next_attempt_at__isnull=True, updated__lte=now - grace)
    )
    abandoned = Q(status=DeliveryStatus.SENDING, lease_until__lt=now)
    rows = (
        WebhookDelivery.objects.filter(overdue | abandoned)
        .order_by(F("next_attempt_at").asc(nulls_first=True), "pk")
        .values_list("pk", "attempts")[:SWEEP_BATCH]
    )
    max_attempts = int(settings.WEBHOOK_MAX_ATTEMPTS)
    out = Swept(resent=[], failed=[])
    for pk, attempts in rows:
        if attempts >= max_attempts:  # only an abandoned last attempt gets here
            done = WebhookDelivery.objects.filter(abandoned, pk=pk, attempts=attempts).update(
                status=DeliveryStatus.FAILED,
                lease_until=None,
                updated=now,
                last_error="the worker making the last attempt stopped before it finished",
            )
            if done:
                out.failed.append(pk)
            continue
        deliver_webhook.apply_async((pk, attempts + 1), expires=float(grace.total_seconds()) * 4)
        out.resent.append((pk, attempts + 1))
    if out.resent or out.failed:
        log.warning(
            "webhook sweep: %d overdue attempt(s) enqueued again, %d abandoned delivery(ies) failed",
            len(out.resent),
            len(out.failed),
        )
    return out

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
from datetime import timedelta

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


def _claim(delivery_id: int) -> bool:
    """Take the delivery for one attempt (counting it), unless it is finished or an attempt is in flight."""
    now = timezone.now()
    lease = now + timedelta(seconds=float(settings.WEBHOOK_TIMEOUT_S) * 2 + 30)
    claimable = Q(status__in=[DeliveryStatus.PENDING, DeliveryStatus.RETRYING]) | Q(
        status=DeliveryStatus.SENDING, lease_until__lt=now
    )
    return bool(
        WebhookDelivery.objects.filter(claimable, pk=delivery_id).update(
            status=DeliveryStatus.SENDING, attempts=F("attempts") + 1, lease_until=lease, updated=now
        )
    )


def _finish(delivery: WebhookDelivery, status: str, **fields) -> None:
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        status=status, lease_until=None, updated=timezone.now(), **fields
    )


def attempt(delivery_id: int) -> Outcome:
    """One attempt of a delivery (idempotent: a finished delivery, or one being attempted, is left as it
    is). Says when to try again, if it should be."""
    if not _claim(delivery_id):
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
    _finish(delivery, DeliveryStatus.RETRYING, status_code=code, last_error=error[:ERROR_MAX])
    return Outcome(DeliveryStatus.RETRYING, retry_in=backoff_s(attempts))


@shared_task(name="alerts.deliver_webhook", acks_late=True)
def deliver_webhook(delivery_id: int) -> str:
    """Attempt a delivery; after a failed attempt, enqueue the next one after its backoff."""
    outcome = attempt(delivery_id)
    if outcome.retry_in is not None:
        log.info("webhook delivery %s failed; next attempt in %.1fs", delivery_id, outcome.retry_in)
        deliver_webhook.apply_async((delivery_id,), countdown=outcome.retry_in)
    return outcome.status

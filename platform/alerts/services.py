"""Writes of the alerts app: raising, repeating and resolving alerts; metric rules; webhooks and the
deliveries an opened alert queues for them.

Every alert is raised here by the platform (alerts/receivers.py: a run's failure, an engine ``alert``
event stored; alerts/rules.py: a rule found true), in the transaction of what caused it. Its live
message and its webhook deliveries leave after that transaction commits.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import Project
from alerts import url_guard
from alerts.delivery import deliver_webhook
from alerts.models import (
    Alert,
    AlertKind,
    Goal,
    MetricRule,
    RuleKind,
    Webhook,
    WebhookDelivery,
)
from experiments.models import Run
from rl_engine import wire
from tracking import live

log = logging.getLogger(__name__)

MESSAGE_MAX = 1000  # characters of an alert's message (the engine's text is cut here)
WEBHOOK_SECRET_BYTES = 32
WEBHOOK_EVENT = "alert.opened"


class LimitReached(ValueError):
    """A project already has the most webhooks or rules it may have; the message names the setting."""


def _check_room(project: Project, model: type[MetricRule] | type[Webhook], setting: str, what: str) -> None:
    """In a transaction: the project row locked, so two creates at once cannot both take the last place."""
    limit = int(getattr(settings, setting))
    Project.objects.select_for_update().filter(pk=project.pk).first()
    if model.objects.filter(project=project).count() >= limit:
        raise LimitReached(f"this project has {limit} {what}, the most it may have ({setting})")


def bounded_message(text: str) -> str:
    text = (text or "").replace("\x00", "").strip()
    return text if len(text) <= MESSAGE_MAX else text[: MESSAGE_MAX - 1] + "…"


def alert_key(kind: str, rule_id: int | None = None) -> str:
    return f"rule:{rule_id}" if kind == AlertKind.RULE else str(kind)


def live_alert(alert: Alert) -> wire.AlertMessage:
    return wire.live_alert(
        wire.LiveAlertOut(
            id=alert.pk,
            kind=alert.kind,  # type: ignore[typeddict-item]
            message=alert.message,
            first_seen=alert.first_seen.isoformat(),
            last_seen=alert.last_seen.isoformat(),
            count=alert.count,
            resolved_at=alert.resolved_at.isoformat() if alert.resolved_at else None,
        )
    )


def _publish_on_commit(alert: Alert) -> None:
    message = live_alert(alert)
    transaction.on_commit(lambda: live.publish(alert.run_id, message))


@dataclass(frozen=True)
class Raised:
    alert: Alert
    opened: bool  # a new alert (webhooks were notified); False: an open one was repeated


def alert_raise(
    *,
    run_id: int,
    kind: AlertKind,
    message: str,
    rule: MetricRule | None = None,
    detail: dict[str, Any] | None = None,
) -> Raised:
    """Open an alert of ``kind`` on the run, or repeat the open one of the same key (bumping
    ``last_seen`` and ``count``, the message replaced by the latest). A new alert queues a delivery for
    each active webhook of the project that takes its kind."""
    key = alert_key(kind, rule.pk if rule else None)
    now = timezone.now()
    text = bounded_message(message)
    with transaction.atomic():
        run = Run.objects.only("pk", "project_id").get(pk=run_id)
        for _ in range(2):  # a concurrent raise of the same key may open it between our read and write
            open_alert = (
                Alert.objects.select_for_update().filter(run_id=run_id, key=key, resolved_at=None).first()
            )
            if open_alert is not None:
                open_alert.count += 1
                open_alert.last_seen = now
                open_alert.message = text
                if detail is not None:
                    open_alert.detail = detail
                open_alert.save(update_fields=["count", "last_seen", "message", "detail"])
                _publish_on_commit(open_alert)
                return Raised(alert=open_alert, opened=False)
            try:
                with transaction.atomic():
                    alert = Alert.objects.create(
                        project_id=run.project_id,
                        run_id=run_id,
                        kind=kind,
                        rule=rule,
                        key=key,
                        message=text,
                        detail=detail or {},
                        first_seen=now,
                        last_seen=now,
                    )
            except IntegrityError:
                continue
            _queue_deliveries(alert)
            _publish_on_commit(alert)
            return Raised(alert=alert, opened=True)
    raise RuntimeError(f"could not raise alert {key} on run {run_id}")


def alert_resolve(*, alert: Alert, user: Any | None) -> Alert:
    """Resolve an open alert (idempotent: a resolved one is returned as it is). A later repeat opens a
    new alert."""
    with transaction.atomic():
        alert = Alert.objects.select_for_update().get(pk=alert.pk)
        if alert.resolved_at is None:
            alert.resolved_at = timezone.now()
            alert.resolved_by = user if user is not None and user.is_authenticated else None
            alert.save(update_fields=["resolved_at", "resolved_by"])
            _publish_on_commit(alert)
    return alert


# --- metric rules ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleSpec:
    metric: str
    kind: RuleKind
    steps: int
    goal: Goal = Goal.MAX
    active: bool = True


def rule_create(*, project: Project, spec: RuleSpec, user: Any | None) -> MetricRule:
    """Raises LimitReached when the project has ALERT_RULES_PER_PROJECT rules already."""
    with transaction.atomic():
        _check_room(project, MetricRule, "ALERT_RULES_PER_PROJECT", "metric rules")
        return MetricRule.objects.create(
            project=project,
            metric=spec.metric,
            kind=spec.kind,
            goal=spec.goal,
            steps=spec.steps,
            active=spec.active,
            created_by=user if user is not None and user.is_authenticated else None,
        )


def rule_update(*, rule: MetricRule, changes: dict[str, Any]) -> MetricRule:
    """Change a rule's fields; a change of what it watches starts its reading over (its state rows)."""
    from alerts.models import RuleState

    with transaction.atomic():
        watched = {"metric", "kind", "goal"}
        for name, value in changes.items():
            setattr(rule, name, value)
        rule.save()
        if watched & set(changes):
            RuleState.objects.filter(rule=rule).delete()
    return rule


def rule_delete(*, rule: MetricRule) -> None:
    """Delete a rule; its open alerts are resolved (they keep their history, without the rule)."""
    with transaction.atomic():
        for alert in Alert.objects.filter(rule=rule, resolved_at=None):
            alert_resolve(alert=alert, user=None)
        rule.delete()


# --- webhooks ---------------------------------------------------------------------------------------------


def webhook_create(
    *, project: Project, url: str, secret: str = "", events: list[str] | None = None, user: Any | None
) -> Webhook:
    """Raises url_guard.UrlRefused for a URL the platform will not send to, LimitReached when the
    project has WEBHOOKS_PER_PROJECT webhooks already."""
    url_guard.check(url)
    with transaction.atomic():
        _check_room(project, Webhook, "WEBHOOKS_PER_PROJECT", "webhooks")
        return Webhook.objects.create(
            project=project,
            url=url,
            secret=secret or secrets.token_urlsafe(WEBHOOK_SECRET_BYTES),
            events=sorted(set(events or [])),
            created_by=user if user is not None and user.is_authenticated else None,
        )


def webhook_update(*, webhook: Webhook, changes: dict[str, Any]) -> Webhook:
    if "url" in changes:
        url_guard.check(changes["url"])
    if "events" in changes:
        changes = {**changes, "events": sorted(set(changes["events"]))}
    for name, value in changes.items():
        setattr(webhook, name, value)
    webhook.save()
    return webhook


def webhook_delete(*, webhook: Webhook) -> None:
    webhook.delete()


def delivery_payload(alert: Alert, delivery_id: str) -> dict[str, Any]:
    """The JSON body of a delivery (docs/api.md, "Webhooks")."""
    run = alert.run
    base = getattr(settings, "PLATFORM_URL", "").rstrip("/")
    return {
        "delivery_id": delivery_id,
        "event": WEBHOOK_EVENT,
        "alert": {
            "id": alert.pk,
            "kind": alert.kind,
            "message": alert.message,
            "rule": alert.rule_id,
            "detail": alert.detail,
            "first_seen": alert.first_seen.isoformat(),
            "last_seen": alert.last_seen.isoformat(),
            "count": alert.count,
        },
        "run": {
            "id": run.pk,
            "experiment": run.experiment_id,
            "number": run.number,
            "state": run.state,
            "url": f"{base}/runs/{run.pk}/",
        },
        "project": {"id": alert.project_id, "name": alert.project.name},
    }


DELIVERY_WINDOW = timedelta(hours=1)


def deliveries_left(project_id: int) -> int:
    """How many more deliveries the project's alerts may queue now: WEBHOOK_DELIVERIES_PER_HOUR less
    those queued in the last hour (counted in the database, at most the budget's worth of rows read)."""
    budget = int(settings.WEBHOOK_DELIVERIES_PER_HOUR)
    since = timezone.now() - DELIVERY_WINDOW
    recent = WebhookDelivery.objects.filter(webhook__project_id=project_id, created__gte=since)
    return max(0, budget - recent.values("pk")[:budget].count())


def _queue_deliveries(alert: Alert) -> list[WebhookDelivery]:
    """A delivery per active webhook of the project that takes the alert's kind, each enqueued for the
    delivery task once the transaction commits; beyond the project's hourly budget, none: the alert's
    detail says how many webhooks were not notified."""
    hooks = [
        hook
        for hook in Webhook.objects.filter(project_id=alert.project_id, active=True)
        if not hook.events or alert.kind in hook.events
    ]
    if not hooks:
        return []
    room = deliveries_left(alert.project_id)
    if room < len(hooks):
        skipped = len(hooks) - room
        log.warning(
            "project %s: over WEBHOOK_DELIVERIES_PER_HOUR, alert %s notifies %d of %d webhooks",
            alert.project_id, alert.pk, room, len(hooks),
        )  # fmt: skip
        alert.detail = {**alert.detail, "webhooks_not_notified": skipped}
        alert.save(update_fields=["detail"])
        hooks = hooks[:room]
    out: list[WebhookDelivery] = []
    for hook in hooks:
        delivery = WebhookDelivery(webhook=hook, alert=alert, payload={}, next_attempt_at=timezone.now())
        delivery.payload = delivery_payload(alert, str(delivery.delivery_id))
        delivery.save()
        out.append(delivery)
        transaction.on_commit(lambda pk=delivery.pk: _enqueue_first_attempt(pk))
    return out


def _enqueue_first_attempt(delivery_pk: int) -> None:
    """After the alert's commit: a broker that is down must not fail what raised the alert (an
    ingestion, a run's transition); the beat sweep sends the delivery once it is overdue."""
    try:
        deliver_webhook.delay(delivery_pk, 1)
    except Exception:
        log.exception("could not enqueue webhook delivery %s; the sweep will send it", delivery_pk)

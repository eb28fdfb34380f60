"""Reads of the alerts app: what a user may see (alerts and rules: members of every role; webhooks and
their deliveries: the project's owners)."""

from __future__ import annotations

from django.db.models import OuterRef, QuerySet, Subquery
from rest_framework.request import Request

from accounts.access import project_roles, visible_project_ids
from accounts.models import Role
from alerts.models import Alert, MetricRule, Webhook, WebhookDelivery


def visible_alerts(request: Request) -> QuerySet[Alert]:
    return Alert.objects.filter(project_id__in=visible_project_ids(request))


def visible_rules(request: Request) -> QuerySet[MetricRule]:
    return MetricRule.objects.filter(project_id__in=visible_project_ids(request))


def owned_project_ids(request: Request) -> list[int]:
    return [pk for pk, role in project_roles(request).items() if role == Role.OWNER]


LAST_DELIVERY_FIELDS = ("status", "attempts", "status_code", "updated")


def with_last_delivery(qs: QuerySet[Webhook]) -> QuerySet[Webhook]:
    """Each webhook with its latest delivery's fields as ``last_delivery_<field>`` (one query for the
    list, by the (webhook) index of the deliveries)."""
    latest = WebhookDelivery.objects.filter(webhook=OuterRef("pk")).order_by("-pk")
    return qs.annotate(
        **{f"last_delivery_{name}": Subquery(latest.values(name)[:1]) for name in LAST_DELIVERY_FIELDS}
    )


def visible_webhooks(request: Request) -> QuerySet[Webhook]:
    """Webhooks of every project the user is in (the views refuse below owner with a 403)."""
    return with_last_delivery(Webhook.objects.filter(project_id__in=visible_project_ids(request)))


def owned_webhooks(request: Request) -> QuerySet[Webhook]:
    return with_last_delivery(Webhook.objects.filter(project_id__in=owned_project_ids(request)))


def webhook_deliveries(webhook: Webhook) -> QuerySet[WebhookDelivery]:
    return WebhookDelivery.objects.filter(webhook=webhook)

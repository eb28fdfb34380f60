"""Input/output shapes of the alerts API."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from alerts.models import (
    Alert,
    AlertKind,
    DeliveryStatus,
    Goal,
    MetricRule,
    RuleKind,
    Webhook,
    WebhookDelivery,
)


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise serializers.ValidationError("must not contain NUL")
    return value


class StaysInItsProject:
    """An update may repeat the object's project but never move it to another (400 at ``project``)."""

    instance: Any
    noun = "it"

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if (
            self.instance is not None
            and attrs.get("project_id", self.instance.project_id) != self.instance.project_id
        ):
            raise serializers.ValidationError({"project": [f"{self.noun} cannot move to another project"]})
        return attrs


class AlertSerializer(serializers.ModelSerializer):
    open = serializers.SerializerMethodField()

    class Meta:
        model = Alert
        fields = ["id", "project", "run", "kind", "rule", "message", "detail", "first_seen", "last_seen",
                  "count", "resolved_at", "resolved_by", "open"]  # fmt: skip
        read_only_fields = fields

    def get_open(self, obj: Alert) -> bool:
        return obj.resolved_at is None


class MetricRuleSerializer(StaysInItsProject, serializers.ModelSerializer):
    noun = "a rule"

    project = serializers.IntegerField(
        source="project_id", min_value=1, help_text="Chosen at creation, never moved."
    )
    metric = serializers.CharField(
        max_length=200, validators=[_no_nul], help_text="A metric key, e.g. reward/mean."
    )
    kind = serializers.ChoiceField(choices=RuleKind.choices)
    goal = serializers.ChoiceField(
        choices=Goal.choices, default=Goal.MAX, help_text="no_improvement: whether higher or lower is better."
    )
    steps = serializers.IntegerField(min_value=1, max_value=10_000_000)

    class Meta:
        model = MetricRule
        fields = ["id", "project", "metric", "kind", "goal", "steps", "active", "created"]
        read_only_fields = ["id", "created"]


class LastDeliverySerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=DeliveryStatus.choices)
    attempts = serializers.IntegerField()
    status_code = serializers.IntegerField(allow_null=True)
    updated = serializers.DateTimeField()


class WebhookSerializer(StaysInItsProject, serializers.ModelSerializer):
    noun = "a webhook"

    project = serializers.IntegerField(
        source="project_id", min_value=1, help_text="Chosen at creation, never moved."
    )
    url = serializers.CharField(
        max_length=2000, help_text="http(s); see docs/api.md, Webhooks, for what is refused."
    )
    secret = serializers.CharField(
        write_only=True,
        required=False,
        min_length=16,
        max_length=200,
        validators=[_no_nul],
        help_text="The HMAC key (default: generated). Returned once, in the answer to the creation.",
    )
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=AlertKind.choices),
        required=False,
        max_length=len(AlertKind.choices),
        help_text="Alert kinds to receive ([]: all).",
    )

    last_delivery = serializers.SerializerMethodField(help_text="The latest delivery (null: none yet).")

    class Meta:
        model = Webhook
        fields = ["id", "project", "url", "secret", "active", "events", "created", "last_delivery"]
        read_only_fields = ["id", "created"]

    @extend_schema_field(LastDeliverySerializer(allow_null=True))
    def get_last_delivery(self, obj: Webhook) -> dict[str, Any] | None:
        names = ("status", "attempts", "status_code", "updated")
        if hasattr(obj, "last_delivery_status"):  # annotated by selectors.with_last_delivery
            values = {name: getattr(obj, f"last_delivery_{name}") for name in names}
        else:  # just created or changed: one query
            values = WebhookDelivery.objects.filter(webhook=obj).order_by("-pk").values(*names).first()
        if not values or values["status"] is None:
            return None
        return LastDeliverySerializer(values).data


class WebhookCreatedSerializer(WebhookSerializer):
    secret = serializers.CharField(read_only=True, help_text="The HMAC key: shown this once.")


class WebhookDeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookDelivery
        fields = ["id", "delivery_id", "webhook", "alert", "status", "attempts", "status_code", "last_error",
                  "created", "updated", "delivered_at"]  # fmt: skip
        read_only_fields = fields

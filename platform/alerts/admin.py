from django.contrib import admin

from alerts.models import Alert, MetricRule, Webhook, WebhookDelivery


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "project",
        "run",
        "kind",
        "message",
        "count",
        "first_seen",
        "last_seen",
        "resolved_at",
    )
    list_filter = ("kind",)
    raw_id_fields = ("run", "project", "rule", "resolved_by")
    show_full_result_count = False


@admin.register(MetricRule)
class MetricRuleAdmin(admin.ModelAdmin):
    list_display = ("id", "project", "metric", "kind", "goal", "steps", "active")
    raw_id_fields = ("project", "created_by")


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ("id", "project", "url", "active", "events", "created")
    raw_id_fields = ("project", "created_by")
    exclude = ("secret",)  # never shown again after creation


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """The delivery log: what was sent where, how often, and the last error."""

    list_display = (
        "delivery_id",
        "webhook",
        "alert",
        "status",
        "attempts",
        "status_code",
        "last_error",
        "next_attempt_at",
        "updated",
    )
    list_filter = ("status",)
    raw_id_fields = ("webhook", "alert")
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]
    show_full_result_count = False

from django.urls import path

from alerts import api

urlpatterns = [
    path("alerts", api.AlertListView.as_view(), name="api-alerts"),
    path("alerts/<int:pk>/resolve", api.AlertResolveView.as_view(), name="api-alert-resolve"),
    path("alert-rules", api.MetricRuleListView.as_view(), name="api-alert-rules"),
    path("alert-rules/<int:pk>", api.MetricRuleDetailView.as_view(), name="api-alert-rule"),
    path("webhooks", api.WebhookListView.as_view(), name="api-webhooks"),
    path("webhooks/<int:pk>", api.WebhookDetailView.as_view(), name="api-webhook"),
    path(
        "webhooks/<int:pk>/deliveries", api.WebhookDeliveryListView.as_view(), name="api-webhook-deliveries"
    ),
]

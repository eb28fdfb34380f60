from django.urls import path

from tracking import api

urlpatterns = [
    path("runs/<int:run_id>/metrics", api.RunMetricsView.as_view(), name="api-run-metrics"),
    path("runs/<int:run_id>/metrics/keys", api.RunMetricKeysView.as_view(), name="api-run-metric-keys"),
    path("runs/<int:run_id>/metrics/export/csv", api.RunMetricsCsvView.as_view(), name="api-run-metrics-csv"),
    path(
        "runs/<int:run_id>/metrics/export/json", api.RunMetricsJsonView.as_view(), name="api-run-metrics-json"
    ),
    path("runs/<int:run_id>/events", api.RunEventsView.as_view(), name="api-run-events"),
    path("runs/<int:run_id>/heartbeat", api.RunHeartbeatView.as_view(), name="api-run-heartbeat"),
    path("runs/<int:run_id>/samples", api.RunSamplesView.as_view(), name="api-run-samples"),
    path("runs/<int:run_id>/checkpoints", api.RunCheckpointsView.as_view(), name="api-run-checkpoints"),
]

from django.urls import path

from launcher import api

urlpatterns = [
    path("runs/<int:run_id>/exports", api.RunExportsView.as_view(), name="api-run-exports"),
    path(
        "runs/<int:run_id>/checkpoints/<int:step>/export",
        api.CheckpointExportView.as_view(),
        name="api-checkpoint-export",
    ),
]

from django.urls import path

from experiments import api

urlpatterns = [
    path("schema/experiment", api.ExperimentSchemaView.as_view(), name="api-experiment-schema"),
    path("presets", api.PresetListView.as_view(), name="api-presets"),
    path("presets/<str:name>", api.PresetDetailView.as_view(), name="api-preset"),
    path("models", api.ModelListView.as_view(), name="api-models"),
    path("rewards", api.RewardListView.as_view(), name="api-rewards"),
    path("tasks", api.TaskListView.as_view(), name="api-tasks"),
    path("experiments", api.ExperimentListView.as_view(), name="api-experiments"),
    path("experiments/import", api.ExperimentImportView.as_view(), name="api-experiment-import"),
    path("experiments/<int:pk>", api.ExperimentDetailView.as_view(), name="api-experiment"),
    path("experiments/<int:pk>/clone", api.ExperimentCloneView.as_view(), name="api-experiment-clone"),
    path("experiments/<int:pk>/yaml", api.ExperimentYamlView.as_view(), name="api-experiment-yaml"),
    path("runs", api.RunListView.as_view(), name="api-runs"),
    path("runs/compare", api.RunCompareView.as_view(), name="api-runs-compare"),  # config diff
    path("runs/<int:pk>", api.RunDetailView.as_view(), name="api-run"),
    path("runs/<int:pk>/cancel", api.RunCancelView.as_view(), name="api-run-cancel"),
    path("runs/<int:pk>/resume", api.RunResumeView.as_view(), name="api-run-resume"),
    # fork
    path("runs/<int:pk>/fork", api.RunForkView.as_view(), name="api-run-fork"),
]

from django.urls import path

from sweeps import api

urlpatterns = [
    path("sweeps", api.SweepListView.as_view(), name="api-sweeps"),
    path("sweeps/<int:pk>", api.SweepDetailView.as_view(), name="api-sweep"),
    path("sweeps/<int:pk>/cancel", api.SweepCancelView.as_view(), name="api-sweep-cancel"),
]

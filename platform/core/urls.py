from django.urls import path

from core.api import HealthView

urlpatterns = [path("health/", HealthView.as_view(), name="health")]

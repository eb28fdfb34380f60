"""Root URLs. Each app owns its own urls module; the API lives under /api/."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from accounts.views_web import login_throttled

urlpatterns = [
    path("admin/login/", login_throttled(admin.site.login)),  # the login rates apply to the admin too
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="openapi-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="openapi-schema"), name="api-docs"),
    path("api/", include("core.urls")),
    path("api/", include("accounts.urls")),
    path("api/", include("experiments.urls")),
    path("api/", include("tracking.urls")),
    path("api/", include("launcher.urls")),
    path("api/", include("alerts.urls")),  # alerts, metric rules, webhooks
    path("api/", include("sweeps.urls")),  # sweeps
    path("", include("experiments.web_urls")),
    path("", include("sweeps.web_urls")),  # the sweep page
]

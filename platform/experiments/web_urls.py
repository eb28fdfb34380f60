"""The web UI's pages (included at the site root by config/urls.py). Changes go through /api/.

Session login/logout are Django's views at /accounts/login/ (rate-limited: accounts.views_web) and
/accounts/logout/ (POST).
"""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from accounts.views_web import LoginView
from experiments import views_web

urlpatterns = [
    path("accounts/login/", LoginView.as_view(redirect_authenticated_user=False), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views_web.home, name="web-home"),
    path("projects/<int:pk>/", views_web.project_settings, name="web-project"),
    path("experiments/new/", views_web.experiment_new, name="web-experiment-new"),
    path("experiments/<int:pk>/", views_web.experiment_detail, name="web-experiment"),
    path("runs/<int:pk>/", views_web.run_dashboard, name="web-run"),
    path("compare/", views_web.compare, name="web-compare"),
]

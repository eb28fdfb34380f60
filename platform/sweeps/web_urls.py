"""The sweep page (included at the site root by config/urls.py)."""

from django.urls import path

from sweeps import views_web

urlpatterns = [path("sweeps/<int:pk>/", views_web.sweep_page, name="web-sweep")]

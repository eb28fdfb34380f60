from django.apps import AppConfig


class LauncherConfig(AppConfig):
    name = "launcher"
    default_auto_field = "django.db.models.BigAutoField"

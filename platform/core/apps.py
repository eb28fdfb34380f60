from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Platform core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import receivers  # noqa: F401 - records each sweep a worker runs

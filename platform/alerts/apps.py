from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "alerts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The receivers that turn a run's failure and the engine's stored alert events into alerts.
        from alerts import receivers  # noqa: F401

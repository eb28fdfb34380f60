from django.apps import AppConfig


class TrackingConfig(AppConfig):
    name = "tracking"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the wire models' schema extension with drf-spectacular (the OpenAPI document), and
        # the receiver that records a run's state changes as its status events.
        from tracking import openapi, receivers  # noqa: F401

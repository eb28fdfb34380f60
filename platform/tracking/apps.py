from django.apps import AppConfig


class TrackingConfig(AppConfig):
    name = "tracking"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the wire models' schema extension with drf-spectacular (the OpenAPI document).
        from tracking import openapi  # noqa: F401

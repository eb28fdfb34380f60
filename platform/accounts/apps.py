from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the token scheme with drf-spectacular (the OpenAPI document lists it).
        from accounts import authentication, receivers  # noqa: F401

import os

from django.apps import AppConfig

# Ray's Jobs SDK lets these environment variables override the address of *every* client it builds,
# whatever address the caller passes. The launcher resolves each run's cluster itself (settings read
# RAY_ADDRESS at startup: the default cluster of provider "address"), so they must not stay in its
# process environment: a run on the local head would otherwise be sent to the RAY_ADDRESS cluster.
_SDK_ADDRESS_OVERRIDES = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")


class LauncherConfig(AppConfig):
    name = "launcher"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Runs at django.setup(), before a server or worker starts any thread.
        for name in _SDK_ADDRESS_OVERRIDES:
            os.environ.pop(name, None)
        from launcher import lifecycle  # noqa: F401 - enqueues the tasks of queued and cancelled runs

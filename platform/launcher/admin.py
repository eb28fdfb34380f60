from django.contrib import admin

from launcher.models import Supervision


@admin.register(Supervision)
class SupervisionAdmin(admin.ModelAdmin):
    list_display = ("run", "owner", "lease_until", "log_offset", "attaches", "updated_at")
    readonly_fields = (
        "run",
        "owner",
        "lease_until",
        "log_offset",
        "attaches",
        "stop_requested_at",
        "updated_at",
    )

from django.contrib import admin

from launcher.models import Export, Supervision


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


@admin.register(Export)
class ExportAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "step", "state", "out", "requested_by", "updated_at")
    list_filter = ("state",)
    readonly_fields = tuple(f.name for f in Export._meta.fields)

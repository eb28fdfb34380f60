from django.contrib import admin

from core.models import WorkerPing


@admin.register(WorkerPing)
class WorkerPingAdmin(admin.ModelAdmin):
    list_display = ("hostname", "broker", "sent_at", "answered_at")
    readonly_fields = ("token", "hostname", "broker", "sent_at", "answered_at")

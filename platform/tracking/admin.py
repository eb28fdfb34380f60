from django.contrib import admin

from tracking.models import Checkpoint, MetricPoint, MetricRollup, RunEvent, RunProgress, Sample


@admin.register(MetricPoint)
class MetricPointAdmin(admin.ModelAdmin):
    list_display = ("run", "key", "step", "value", "wall_time")
    search_fields = ("key",)
    raw_id_fields = ("run",)
    show_full_result_count = False  # counting millions of points on every page load is slow


@admin.register(RunEvent)
class RunEventAdmin(admin.ModelAdmin):
    list_display = ("run", "seq", "kind", "message", "created")
    list_filter = ("kind",)
    raw_id_fields = ("run",)
    show_full_result_count = False


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "path", "size_bytes", "created")
    raw_id_fields = ("run",)


@admin.register(Sample)
class SampleAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "reward", "version_start", "version_end", "created")
    raw_id_fields = ("run",)
    show_full_result_count = False


@admin.register(MetricRollup)
class MetricRollupAdmin(admin.ModelAdmin):
    """Derived data (kept by the ingest statement): read-only here."""

    list_display = ("run", "key", "width", "bucket", "count", "min_value", "max_value")
    list_filter = ("width",)
    raw_id_fields = ("run",)
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(RunProgress)
class RunProgressAdmin(admin.ModelAdmin):
    """Kept by ingestion (read-only here): what the launcher's stall check reads."""

    list_display = ("run", "step", "at")
    raw_id_fields = ("run",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

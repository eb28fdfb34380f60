from django.contrib import admin

from sweeps.models import Sweep, SweepRun


@admin.register(Sweep)
class SweepAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "name",
        "project",
        "experiment",
        "method",
        "max_runs",
        "max_concurrent",
        "created_at",
    ]
    list_filter = ["method"]


@admin.register(SweepRun)
class SweepRunAdmin(admin.ModelAdmin):
    list_display = ["id", "sweep", "index", "run", "seed", "early_stopped_at"]

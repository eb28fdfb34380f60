from django.contrib import admin

from experiments.models import Experiment, Run


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "created_by", "created_at", "run_counter")
    list_filter = ("project",)
    search_fields = ("name", "description")


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Read-mostly: state changes go through experiments.services.run_transition, never a form save."""

    list_display = ("__str__", "project", "state", "priority", "provider", "created_at", "finished_at")
    list_filter = ("state", "provider", "project")
    search_fields = ("experiment__name", "ray_job_id")
    readonly_fields = [f.name for f in Run._meta.fields if f.name != "priority"]

"""Input/output shapes of the experiments API. Config validation is the engine's pydantic schema."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from experiments.models import Experiment, Run
from experiments.services import clean_tags
from rl_engine.config import FORK_FIXED, ConfigError, ExperimentConfig, fork_config, joined, parse_config


def config_error_dict(exc: ConfigError, prefix: str = "config") -> dict[str, list[str]]:
    """pydantic paths -> DRF error dict: {"config.rollout.n": ["..."]} (root errors under ``prefix``)."""
    return exc.under(prefix).by_path()


class TagsField(serializers.ListField):
    child = serializers.CharField(max_length=50)

    def to_internal_value(self, data: Any) -> list[str]:
        values = super().to_internal_value(data)
        try:
            return clean_tags(values)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class ExperimentSerializer(serializers.ModelSerializer):
    tags = TagsField(required=False, max_length=20)
    config = serializers.JSONField(help_text="An ExperimentConfig (see GET /api/schema/experiment).")
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)
    run_count = serializers.IntegerField(source="run_counter", read_only=True)

    class Meta:
        model = Experiment
        fields = [
            "id",
            "project",
            "name",
            "description",
            "tags",
            "config",
            "created_by",
            "created_at",
            "updated_at",
            "run_count",
        ]
        read_only_fields = ["id", "created_by", "created_at", "updated_at", "run_count"]

    def get_fields(self):
        fields = super().get_fields()
        # Chosen at creation, never moved; an id the user cannot see is a 404 (checked in the view).
        fields["project"] = serializers.IntegerField(
            min_value=1,
            read_only=self.instance is not None,
            source="project_id",
        )
        return fields

    def validate_config(self, value: Any) -> ExperimentConfig:
        """Validated here, once: the services take the ExperimentConfig as it is."""
        try:
            return parse_config(value)
        except ConfigError as exc:
            raise serializers.ValidationError(config_error_dict(exc, prefix="")) from None

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError as exc:
            raise serializers.ValidationError(_flatten_config_errors(exc.detail)) from None


def _flatten_config_errors(detail: Any) -> Any:
    """Turn {"config": {"rollout.n": [...]}} into {"config.rollout.n": [...]} (one level of field paths)."""
    if not isinstance(detail, dict) or not isinstance(detail.get("config"), dict):
        return detail
    flat = {k: v for k, v in detail.items() if k != "config"}
    for path, msgs in detail["config"].items():
        flat[joined("config", path)] = msgs
    return flat


class ExperimentListSerializer(ExperimentSerializer):
    class Meta(ExperimentSerializer.Meta):
        fields = [f for f in ExperimentSerializer.Meta.fields if f != "config"]


class CloneSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)


class YamlImportSerializer(serializers.Serializer):
    project = serializers.IntegerField(min_value=1)
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    tags = TagsField(required=False, max_length=20, default=list)
    yaml = serializers.CharField(max_length=1_000_000, help_text="The config as YAML text.")


class RunSerializer(serializers.ModelSerializer):
    experiment_name = serializers.CharField(source="experiment.name", read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)

    class Meta:
        model = Run
        fields = [
            "id",
            "experiment",
            "experiment_name",
            "project",
            "number",
            "state",
            "priority",
            "provider",
            "cluster_address",
            "ray_job_id",
            "celery_task_id",
            "created_by",
            "created_at",
            "queued_at",
            "started_at",
            "finished_at",
            "heartbeat_at",
            "cancel_requested_at",
            "error",
            "resumed_from",
            "resumed_from_checkpoint",
            "config",
        ]
        read_only_fields = fields


class RunListSerializer(RunSerializer):
    class Meta(RunSerializer.Meta):
        fields = [f for f in RunSerializer.Meta.fields if f != "config"]
        read_only_fields = fields


class RunCreateSerializer(serializers.Serializer):
    experiment = serializers.IntegerField(min_value=1)
    priority = serializers.IntegerField(
        default=0, min_value=-1000, max_value=1000, help_text="Higher starts first."
    )


class ResumeSerializer(serializers.Serializer):
    priority = serializers.IntegerField(required=False, min_value=-1000, max_value=1000)


# --- Config diff of runs (GET /api/runs/compare) -------------------------------------------------------


class IdNameSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class ComparedRunSerializer(serializers.Serializer):
    """One run of a comparison (renders ``selectors.ComparedRun``)."""

    id = serializers.IntegerField(source="run.pk")
    number = serializers.IntegerField(source="run.number")
    label = serializers.SerializerMethodField(help_text='"<experiment name> #<run number>"')
    state = serializers.CharField(source="run.state")
    experiment = IdNameSerializer(source="run.experiment")
    project = IdNameSerializer(source="run.project")
    config_basis = serializers.ChoiceField(
        choices=["validated", "stored"],
        source="config.basis",
        help_text="validated: the stored config parsed with the engine's schema and dumped (every default "
        "explicit); stored: it no longer parses (an older schema), compared as stored.",
    )
    config_problem = serializers.CharField(
        source="config.problem",
        allow_null=True,
        help_text="Why the stored config no longer parses (null when config_basis is validated).",
    )

    def get_label(self, obj: Any) -> str:
        return f"{obj.run.experiment.name} #{obj.run.number}"


class ConfigDifferenceSerializer(serializers.Serializer):
    """One leaf config field whose value is not the same in every run (renders
    ``selectors.ShownDifference``)."""

    path = serializers.CharField(help_text='Dotted field path, e.g. "trainer.lr" (a list is one value).')
    values = serializers.SerializerMethodField(
        help_text="{run id: value} for the runs that have the field (null is a value)."
    )
    absent = serializers.ListField(
        child=serializers.IntegerField(), help_text="Ids of the runs whose config lacks the field."
    )
    cut = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Ids of the runs whose value was too long to show: their value is the start of its JSON "
        "text, ending in an ellipsis.",
    )

    @extend_schema_field({"type": "object", "additionalProperties": {}})
    def get_values(self, obj: Any) -> dict[str, Any]:
        return {str(run_id): value for run_id, value in obj.values.items()}


class RunCompareSerializer(serializers.Serializer):
    runs = ComparedRunSerializer(many=True)
    differences = ConfigDifferenceSerializer(many=True)
    total_differences = serializers.IntegerField(help_text="How many fields differ, shown or not.")
    truncated = serializers.BooleanField(
        help_text="Something was left out: fields past the answer's bounds (the first ones by path are "
        "shown) or values cut (see each difference's `cut`)."
    )


# --- fork ----------------------------------------------------------------------------------------------


class ForkSerializer(ResumeSerializer):
    """A fork's body. Needs ``context["parent"]``: the parent run's config (an ExperimentConfig); the
    merged, validated config comes back as ``validated_data["config"]``."""

    checkpoint = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="Id of one of the run's checkpoints (GET /api/runs/{id}/checkpoints); default: its latest.",
    )
    config_overrides = serializers.JSONField(
        required=False,
        default=dict,
        help_text=(
            "A nested partial config, merged into the run's (mappings key by key, other values replace); "
            f"the result is validated as an ExperimentConfig. Fixed: {', '.join(FORK_FIXED)}."
        ),
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        try:
            attrs["config"] = fork_config(self.context["parent"], attrs.get("config_overrides", {}))
        except ConfigError as exc:
            raise serializers.ValidationError(config_error_dict(exc, prefix="config_overrides")) from None
        return attrs


def _set_by(overrides: dict[str, Any], path: str) -> bool:
    """Whether the overrides set the field at ``path`` (or a value above it)."""
    node: Any = overrides
    for part in path.split("."):
        if not isinstance(node, dict):
            return True
        if part not in node:
            return False
        node = node[part]
    return True


def fork_error_dict(exc: ConfigError, overrides: dict[str, Any]) -> dict[str, list[str]]:
    """A policy refusal of a fork's config: at ``config_overrides.<path>`` where the overrides set that
    field, else at ``config.<path>`` (the parent's own value, which the platform refuses now)."""
    out: dict[str, list[str]] = {}
    for path, msg in exc.errors:
        where = "config_overrides" if path and _set_by(overrides, path) else "config"
        out.setdefault(joined(where, path), []).append(msg)
    return out

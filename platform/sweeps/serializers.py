"""Input/output shapes of the sweeps API."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from sweeps.models import Goal, Method, Summary, Sweep
from sweeps.selectors import sweep_progress
from sweeps.services import SEED_MAX, max_runs_limit


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise serializers.ValidationError("must not contain NUL")
    return value


def _flat(detail: Any, prefix: str = "") -> Any:
    if not isinstance(detail, dict):
        return {prefix: detail} if prefix else detail
    out: dict[str, Any] = {}
    for key, value in detail.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        out.update(_flat(value, path) if isinstance(value, dict) else {path: value})
    return out


class EarlyStoppingSerializer(serializers.Serializer):
    min_steps = serializers.IntegerField(
        default=0, min_value=0, max_value=10_000_000, help_text="Judge a run only from this step on."
    )
    min_runs = serializers.IntegerField(
        default=2, min_value=1, max_value=1000, help_text="How many other runs must have reached the step."
    )


class SweepCreateSerializer(serializers.Serializer):
    experiment = serializers.IntegerField(
        min_value=1, help_text="The base experiment: its config, its project."
    )
    name = serializers.CharField(max_length=200, required=False, validators=[_no_nul])
    method = serializers.ChoiceField(choices=Method.choices)
    search_space = serializers.JSONField(
        help_text=(
            "Dotted config path -> a list of values (grid values), or for a random search "
            '{"uniform": [a, b]}, {"loguniform": [a, b]}, {"int": [a, b]}, {"choice": [...]} or the '
            'strings "uniform(a, b)", "loguniform(a, b)", "int(a, b)".'
        )
    )
    max_runs = serializers.IntegerField(
        required=False, min_value=1, help_text="Random: the number of runs. Grid: default the grid's size."
    )
    max_concurrent = serializers.IntegerField(
        default=1, min_value=1, max_value=1000, help_text="At most this many of its runs busy at once."
    )
    metric = serializers.CharField(max_length=200, validators=[_no_nul], help_text="e.g. reward/mean")
    goal = serializers.ChoiceField(choices=Goal.choices, default=Goal.MAX)
    summary = serializers.ChoiceField(
        choices=Summary.choices, default=Summary.LAST, help_text="How the page ranks runs by default."
    )
    early_stopping = EarlyStoppingSerializer(
        required=False, allow_null=True, help_text="The median rule (off when absent or null)."
    )
    seed = serializers.IntegerField(
        required=False, min_value=0, max_value=SEED_MAX, help_text="Default: drawn. Run i gets seed + i."
    )
    priority = serializers.IntegerField(default=0, min_value=-1000, max_value=1000)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError as exc:  # nested errors at dotted paths: early_stopping.min_steps
            raise serializers.ValidationError(_flat(exc.detail)) from None

    def validate_max_runs(self, value: int) -> int:
        if value > max_runs_limit():
            raise serializers.ValidationError(f"at most {max_runs_limit()}")
        return value


class SweepSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)
    state = serializers.SerializerMethodField(
        help_text="queued | running | cancelling | cancelled | finished"
    )
    run_states = serializers.SerializerMethodField(help_text="Run state -> how many of its runs.")
    early_stopped = serializers.SerializerMethodField()
    params = serializers.SerializerMethodField(help_text="The searched config paths, sorted.")

    class Meta:
        model = Sweep
        fields = ["id", "project", "experiment", "name", "method", "search_space", "max_runs", "max_concurrent",
                  "metric", "goal", "summary", "early_stopping", "seed", "priority", "created_by", "created_at",
                  "cancelled_at", "state", "run_states", "early_stopped", "params"]  # fmt: skip
        read_only_fields = fields

    def _progress(self, obj: Sweep):
        cache = self.context.setdefault("_progress", {})
        if obj.pk not in cache:
            cache[obj.pk] = sweep_progress(obj)
        return cache[obj.pk]

    def get_state(self, obj: Sweep) -> str:
        return self._progress(obj).state

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"}})
    def get_run_states(self, obj: Sweep) -> dict[str, int]:
        return self._progress(obj).counts

    def get_early_stopped(self, obj: Sweep) -> int:
        return self._progress(obj).early_stopped

    def get_params(self, obj: Sweep) -> list[str]:
        return sorted(obj.search_space) if isinstance(obj.search_space, dict) else []


class RankedRunSerializer(serializers.Serializer):
    """One run of a sweep (renders ``selectors.RankedRun``)."""

    id = serializers.IntegerField(source="run_id")
    number = serializers.IntegerField()
    state = serializers.CharField()
    index = serializers.IntegerField(help_text="Its point's place in the sweep (0, 1, ...).")
    params = serializers.DictField(child=serializers.JSONField(), help_text="Config path -> its value.")
    seed = serializers.IntegerField()
    last = serializers.FloatField(allow_null=True, help_text="The metric's value at its latest step.")
    last_step = serializers.IntegerField(allow_null=True)
    best = serializers.FloatField(allow_null=True, help_text="The metric's best value (by the goal).")
    value = serializers.FloatField(allow_null=True, help_text="last or best, as the ranking asked.")
    rank = serializers.IntegerField(allow_null=True, help_text="1 = best; null: no value yet.")
    early_stopped_at = serializers.DateTimeField(allow_null=True)
    early_stop_reason = serializers.CharField()


class SweepDetailSerializer(SweepSerializer):
    ranked_by = serializers.SerializerMethodField(help_text="The summary the runs are ranked by.")
    runs = serializers.SerializerMethodField()

    class Meta(SweepSerializer.Meta):
        fields = [*SweepSerializer.Meta.fields, "ranked_by", "runs"]
        read_only_fields = fields

    def get_ranked_by(self, obj: Sweep) -> str:
        return self.context.get("summary") or obj.summary

    @extend_schema_field(RankedRunSerializer(many=True))
    def get_runs(self, obj: Sweep) -> list[dict[str, Any]]:
        return RankedRunSerializer(self.context["ranked"], many=True).data

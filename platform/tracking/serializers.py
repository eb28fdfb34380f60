"""Shapes of what the tracking API answers to reads, for the OpenAPI document. Ingestion bodies and
answers are the engine's wire format (rl_engine.wire): validated and documented from those models."""

from __future__ import annotations

from rest_framework import serializers

from tracking.models import Checkpoint, RunEvent, Sample


class RunEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["seq", "kind", "message", "data", "created"]


class EventPageSerializer(serializers.Serializer):
    events = RunEventSerializer(many=True)
    last_seq = serializers.IntegerField(help_text="Pass as ?after= to get what follows.")


class SeriesSerializer(serializers.Serializer):
    key = serializers.CharField()
    steps = serializers.ListField(child=serializers.IntegerField())
    values = serializers.ListField(child=serializers.FloatField())
    wall_times = serializers.ListField(child=serializers.FloatField())
    downsampled = serializers.BooleanField()


class MetricQuerySerializer(serializers.Serializer):
    series = SeriesSerializer(many=True)


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = ["id", "step", "path", "size_bytes", "created", "pruned"]

    pruned = serializers.SerializerMethodField(
        help_text="Removed by the engine (trainer.keep_checkpoints): nothing to export, resume or fork from."
    )

    def get_pruned(self, obj: Checkpoint) -> bool:
        return obj.pruned_at is not None


class SampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = Sample
        fields = [
            "id",
            "step",
            "prompt",
            "response",
            "answer",
            "reward",
            "version_start",
            "version_end",
            "reward_parts",
            "turns",
            "created",
        ]

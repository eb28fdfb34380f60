"""Shapes of the tracking API for the OpenAPI document. Ingestion bodies are validated by tracking.wire."""

from __future__ import annotations

from rest_framework import serializers

from tracking.models import Checkpoint, EventKind, RunEvent, Sample
from tracking.services import MAX_EVENTS_PER_BATCH, MAX_POINTS_PER_BATCH, MAX_SAMPLES_PER_BATCH
from tracking.wire import MAX_STEP


class PointSerializer(serializers.Serializer):
    key = serializers.CharField(min_length=1, max_length=200)
    step = serializers.IntegerField(min_value=0, max_value=MAX_STEP)
    value = serializers.FloatField(help_text="Finite.")
    wall_time = serializers.FloatField(help_text="Unix seconds. Finite.")


class MetricsIngestSerializer(serializers.Serializer):
    points = PointSerializer(many=True, help_text=f"At most {MAX_POINTS_PER_BATCH} points (larger: 413).")


class IngestResultSerializer(serializers.Serializer):
    received = serializers.IntegerField()
    inserted = serializers.IntegerField(help_text="New points; a retried batch inserts 0 (first value wins).")


class EventInSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=EventKind.choices)
    message = serializers.CharField(required=False, allow_blank=True, max_length=100_000)
    data = serializers.DictField(required=False)


BATCH_ID_HELP = "Optional id of this batch (1-64 of A-Z a-z 0-9 _ . : -): a re-sent batch is not stored twice."


class EventsIngestSerializer(serializers.Serializer):
    events = EventInSerializer(many=True, help_text=f"At most {MAX_EVENTS_PER_BATCH} events.")
    batch_id = serializers.CharField(required=False, max_length=64, help_text=BATCH_ID_HELP)


class EventsIngestResultSerializer(serializers.Serializer):
    received = serializers.IntegerField()
    last_seq = serializers.IntegerField(allow_null=True)


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
        fields = ["id", "step", "path", "size_bytes", "created"]


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
            "created",
        ]


class SampleInSerializer(serializers.Serializer):
    step = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_STEP, help_text="Defaults to the body's step."
    )
    prompt = serializers.CharField(allow_blank=True, max_length=100_000)
    response = serializers.CharField(allow_blank=True, max_length=100_000)
    answer = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=100_000)
    reward = serializers.FloatField(required=False, allow_null=True)
    version_start = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=2**31 - 1
    )
    version_end = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**31 - 1)


class SamplesIngestSerializer(serializers.Serializer):
    step = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_STEP, help_text="Step of the samples that name none."
    )
    samples = SampleInSerializer(many=True, help_text=f"At most {MAX_SAMPLES_PER_BATCH} samples.")
    batch_id = serializers.CharField(required=False, max_length=64, help_text=BATCH_ID_HELP)


class SamplesIngestResultSerializer(serializers.Serializer):
    received = serializers.IntegerField()
    stored = serializers.IntegerField(help_text="Samples beyond the per-step cap are dropped.")


class HeartbeatSerializer(serializers.Serializer):
    active = serializers.BooleanField(help_text="False: the run is no longer active; the engine should stop.")
    state = serializers.CharField()

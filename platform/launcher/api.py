"""Launcher endpoints: checkpoint exports (``POST /api/runs/{id}/checkpoints/{step}/export`` queues one,
``GET /api/runs/{id}/exports`` lists the latest request per checkpoint), read from the platform's own
``Export`` table."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.access import require_role
from accounts.models import Role
from accounts.parsers import JsonOnly
from experiments.models import Run
from experiments.selectors import visible_runs
from launcher import exports


class ExportSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The export request.")
    step = serializers.IntegerField()
    state = serializers.CharField(help_text="queued, running, succeeded or failed.")
    checkpoint = serializers.CharField(help_text="The checkpoint directory on the run's cluster.")
    out = serializers.CharField(help_text="The exported model directory on the run's cluster.")
    error = serializers.CharField(allow_blank=True)
    size_bytes = serializers.IntegerField(allow_null=True)
    dtype = serializers.CharField(allow_blank=True)
    job_id = serializers.CharField(allow_blank=True, help_text="The Ray job that runs the export.")
    by = serializers.CharField(allow_blank=True, help_text="Who asked for it.")
    requested = serializers.DateTimeField()
    updated = serializers.DateTimeField()


def _run(request: Request, run_id: int, minimum: str) -> Run:
    """One query filtered by visibility (a run of another project is the same 404 as no run), then the
    role: a visible run the user may not change is a 403."""
    run = get_object_or_404(visible_runs(request, "id", "project_id", "created_at"), pk=run_id)
    require_role(request, run.project_id, minimum)
    return run


class RunExportsView(JsonOnly, APIView):
    @extend_schema(responses=ExportSerializer(many=True))
    def get(self, request: Request, run_id: int) -> Response:
        run = _run(request, run_id, Role.VIEWER)
        records = sorted(exports.exports_for_run(run.pk).values(), key=lambda r: r["step"])
        return Response(ExportSerializer(records, many=True).data)


class CheckpointExportView(JsonOnly, APIView):
    @extend_schema(
        request=None,
        responses={
            202: ExportSerializer,
            400: OpenApiResponse(
                description="The checkpoint's path leaves the run's own folder, or the engine removed it."
            ),
            404: OpenApiResponse(description="No such run, or no checkpoint at that step."),
        },
    )
    def post(self, request: Request, run_id: int, step: int) -> Response:
        run = _run(request, run_id, Role.MEMBER)
        try:
            record = exports.export_request(run=run, step=step, username=request.user.get_username())
        except exports.ExportNotFound as exc:
            raise exceptions.NotFound(str(exc)) from None
        except exports.ExportRefused as exc:
            raise exceptions.ValidationError({"checkpoint": [str(exc)]}) from None
        return Response(ExportSerializer(record).data, status=status.HTTP_202_ACCEPTED)

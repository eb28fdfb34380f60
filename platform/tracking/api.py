"""Ingestion (metrics, events, samples, heartbeat) and reads (keys, series, events, checkpoints, samples,
exports) of a run's data. Ingestion accepts the run's ingest token or a project member's credentials."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any

from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from pydantic import BaseModel
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.access import IngestOrMember, ingest_token_run_id, require_ingest
from accounts.models import ApiToken, TokenKind
from accounts.parsers import JsonOnly, query_int, query_str
from accounts.throttles import HeartbeatThrottle, IngestThrottle, project_throttle
from experiments.models import Run
from experiments.run_files import checkpoint_folder, is_inside
from experiments.selectors import visible_runs
from experiments.services import run_heartbeat
from rl_engine import wire
from tracking import selectors, services
from tracking.models import Checkpoint, Sample
from tracking.serializers import (
    CheckpointSerializer,
    EventPageSerializer,
    MetricQuerySerializer,
    RunEventSerializer,
    SampleSerializer,
)


class PayloadTooLarge(exceptions.APIException):
    status_code = 413
    default_code = "payload_too_large"


def _readable_run(request: Request, run_id: int) -> Run:
    """A run the user may read (viewer or better): one query filtered by visibility, so that a run of
    another project answers the same 404 as no run at all."""
    return get_object_or_404(visible_runs(request, "id", "project_id", "state"), pk=run_id)


def _ingest_run(request: Request, run_id: int) -> Run:
    """The run being reported into. An ingest token arrives with its run (authentication loads it): the
    engine's requests, the hot path, read no more rows here."""
    token = request.auth
    if isinstance(token, ApiToken) and token.kind == TokenKind.INGEST and token.run_id == run_id:
        return token.run
    run = visible_runs(request, "id", "project_id", "state", "created_at").filter(pk=run_id).first()
    if run is None:  # another project's run, another run's ingest token, or no such run: one answer
        raise exceptions.NotFound("Not found.")
    require_ingest(request, run.pk, run.project_id)
    return run


def _parse(model: type[wire.M], request: Request, endpoint: str) -> wire.M:
    """The request's body as ``model`` (rl_engine.wire); 413 for a batch over the endpoint's limit, 400
    with the field paths of what is malformed."""
    field, limit = wire.ITEMS[endpoint], wire.LIMITS[endpoint]
    n = wire.batch_length(request.data, field)
    if n is not None and n > limit:
        raise PayloadTooLarge(
            f"{n} {field} in one request; the limit is {limit} per request: split the batch"
        )
    try:
        return wire.parse(model, request.data)
    except wire.WireError as exc:
        raise exceptions.ValidationError(exc.errors) from None


def _reply(reply: BaseModel, code: int = status.HTTP_200_OK) -> Response:
    return Response(reply.model_dump(mode="json"), status=code)


class IngestView(JsonOnly, APIView):
    permission_classes = [IngestOrMember]
    throttle_classes = [IngestThrottle]  # counts POSTs (ingestion) only


def _events_refused(run: Run, events: list[wire.EventIn]) -> dict[str, list[str]]:
    """Event data the platform refuses: malformed checkpoints, reserved status keys, and a checkpoint
    outside the run's own checkpoint folder (resume loads it: it must be this run's own file)."""
    errors = wire.event_data_errors(events)
    folder = checkpoint_folder(run)
    for i, event in enumerate(events):
        path = event.data.get("path") if event.kind == wire.EventKind.CHECKPOINT else None
        key = f"events[{i}].data.path"
        if isinstance(path, str) and key not in errors and not is_inside(path, folder):
            errors[key] = [f"must be inside the run's checkpoint folder {folder}"]
    return errors


def _ingest_schema(endpoint: str, reply: type[BaseModel], code: int, description: str = "") -> Any:
    """An ingestion POST in the OpenAPI document: the wire body and answer, 413 over the batch limit."""
    too_many = f"More than {wire.LIMITS[endpoint]} {wire.ITEMS[endpoint]}."
    return extend_schema(
        request=wire.BODIES[endpoint],
        responses={code: reply, 413: OpenApiResponse(description=too_many)},
        description=description,
    )


class RunMetricsView(IngestView):
    @_ingest_schema(
        wire.METRICS,
        wire.MetricsReply,
        200,
        "Report metric points. Idempotent on (run, key, step): the first value stored wins.",
    )
    def post(self, request: Request, run_id: int) -> Response:
        run = _ingest_run(request, run_id)
        body = _parse(wire.MetricsBody, request, wire.METRICS)
        return _reply(services.metrics_batch_store(run.pk, body))

    @extend_schema(
        parameters=[
            OpenApiParameter("keys", str, description="Comma-separated metric keys (default: all)."),
            OpenApiParameter("step_min", int),
            OpenApiParameter("step_max", int),
            OpenApiParameter(
                "max_points",
                int,
                description=(
                    f"Per key, 2..{selectors.MAX_MAX_POINTS} (default {selectors.DEFAULT_MAX_POINTS}); longer "
                    "series are downsampled keeping each bucket's min and max."
                ),
            ),
        ],
        responses=MetricQuerySerializer,
    )
    def get(self, request: Request, run_id: int) -> Response:
        run = _readable_run(request, run_id)
        keys = _keys_param(request) or selectors.metric_keys(run_id=run.pk)
        max_points = query_int(request, "max_points", minimum=2, maximum=selectors.MAX_MAX_POINTS)
        step_min = query_int(request, "step_min")
        step_max = query_int(request, "step_max")
        out = []
        for key in keys[:100]:
            s = selectors.metric_series(
                run_id=run.pk,
                key=key,
                step_min=step_min,
                step_max=step_max,
                max_points=max_points or selectors.DEFAULT_MAX_POINTS,
            )
            out.append(
                {
                    "key": s.key,
                    "steps": s.steps,
                    "values": s.values,
                    "wall_times": s.wall_times,
                    "downsampled": s.downsampled,
                }
            )
        return Response({"series": out})


def _keys_param(request: Request) -> list[str]:
    raw = query_str(request, "keys", max_length=20_000)
    return [k for k in (raw or "").split(",") if k][:100]


class RunMetricKeysView(JsonOnly, APIView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT}, description='{"keys": ["actor/pg_loss", ...]}')
    def get(self, request: Request, run_id: int) -> Response:
        run = _readable_run(request, run_id)
        return Response({"keys": selectors.metric_keys(run_id=run.pk)})


class RunEventsView(IngestView):
    @_ingest_schema(
        wire.EVENTS,
        wire.EventsReply,
        201,
        "Report log lines, alerts, checkpoints, status notes. Each gets the next seq.",
    )
    def post(self, request: Request, run_id: int) -> Response:
        run = _ingest_run(request, run_id)
        body = _parse(wire.EventsBody, request, wire.EVENTS)
        refused = _events_refused(run, body.events)
        if refused:
            raise exceptions.ValidationError(refused)
        if ingest_token_run_id(request) is None and any(e.kind == wire.EventKind.ALERT for e in body.events):
            # A member's alert opens an alert (webhook deliveries) once the last one is resolved: per
            # project, like resolving. The engine's own alerts are its run's (they repeat the open one).
            project_throttle("alert_events", run.project_id)
        new = [services.NewEvent(kind=e.kind, message=e.message, data=e.data) for e in body.events]
        rows = services.events_ingest(run_id=run.pk, events=new, batch_id=body.batch_id or "")
        reply = wire.EventsReply(received=len(rows), last_seq=rows[-1].seq if rows else None)
        return _reply(reply, status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[
            OpenApiParameter("after", int, description="Only events with seq > after (default 0)."),
            OpenApiParameter("limit", int, description="1..1000 (default 500)."),
            OpenApiParameter("kind", str, description=f"Comma-separated among {', '.join(wire.EventKind)}."),
        ],
        responses=EventPageSerializer,
    )
    def get(self, request: Request, run_id: int) -> Response:
        if not (request.user and request.user.is_authenticated):
            raise exceptions.PermissionDenied("Reading events needs a user.")
        run = _readable_run(request, run_id)
        after = query_int(request, "after") or 0
        limit = query_int(request, "limit", minimum=1, maximum=1000) or 500
        kinds = [k for k in (query_str(request, "kind") or "").split(",") if k]
        if set(kinds) - {k.value for k in wire.EventKind}:
            raise exceptions.ValidationError({"kind": [f"one of {', '.join(wire.EventKind)}"]})
        rows = selectors.events_since(run_id=run.pk, after=after, limit=limit, kinds=kinds)
        return Response(
            {"events": RunEventSerializer(rows, many=True).data, "last_seq": rows[-1].seq if rows else after}
        )


class RunHeartbeatView(IngestView):
    # A bucket of its own: data throttled at the ingest rate never starves the token's renewal.
    throttle_classes = [HeartbeatThrottle]

    @extend_schema(
        request=None,
        responses=wire.HeartbeatReply,
        description="The engine (or its supervisor) is alive. `active: false` means: stop.",
    )
    def post(self, request: Request, run_id: int) -> Response:
        run = _ingest_run(request, run_id)
        active = run_heartbeat(run_id=run.pk)
        state = Run.objects.filter(pk=run.pk).values_list("state", flat=True).get()
        return _reply(wire.HeartbeatReply(active=active, state=state))


class RunSamplesView(IngestView):
    @_ingest_schema(wire.SAMPLES, wire.SamplesReply, 201, "Report example prompts and responses of a step.")
    def post(self, request: Request, run_id: int) -> Response:
        run = _ingest_run(request, run_id)
        body = _parse(wire.SamplesBody, request, wire.SAMPLES)
        return _reply(services.samples_batch_store(run.pk, body), status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[
            OpenApiParameter("step", int, description="Only this step."),
            OpenApiParameter("limit", int, description="1..1000 (default 200)."),
            OpenApiParameter("offset", int),
        ],
        responses=SampleSerializer(many=True),
    )
    def get(self, request: Request, run_id: int) -> Response:
        if not (request.user and request.user.is_authenticated):
            raise exceptions.PermissionDenied("Reading samples needs a user.")
        run = _readable_run(request, run_id)
        qs = Sample.objects.filter(run_id=run.pk).order_by("-step", "id")
        step = query_int(request, "step")
        if step is not None:
            qs = qs.filter(step=step)
        offset = query_int(request, "offset", maximum=10**9) or 0
        limit = query_int(request, "limit", minimum=1, maximum=1000) or 200
        return Response(SampleSerializer(qs[offset : offset + limit], many=True).data)


class RunCheckpointsView(JsonOnly, APIView):
    @extend_schema(responses=CheckpointSerializer(many=True))
    def get(self, request: Request, run_id: int) -> Response:
        run = _readable_run(request, run_id)
        return Response(CheckpointSerializer(Checkpoint.objects.filter(run_id=run.pk), many=True).data)


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_text(cell: str) -> str:
    """A text cell a spreadsheet shows as text: one starting like a formula gets a leading quote."""
    return f"'{cell}" if cell.startswith(FORMULA_START) else cell


def _csv_lines(run_id: int, keys: list[str]) -> Iterator[str]:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["key", "step", "value", "wall_time"])
    for i, row in enumerate(selectors.metric_rows(run_id=run_id, keys=keys)):
        # Only the key is text (from the engine); step and the numbers are written by us.
        writer.writerow([csv_text(row[0]), row[1], repr(row[2]), repr(row[3])])
        if i % 1000 == 999:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


def _json_chunks(run_id: int, keys: list[str]) -> Iterator[str]:
    """``{"run": id, "points": [...]}``: the ingestion body shape, so an export can be posted back."""
    yield f'{{"run": {run_id}, "points": ['
    sep = ""
    for key, step, value, wall_time in selectors.metric_rows(run_id=run_id, keys=keys):
        yield sep + json.dumps({"key": key, "step": step, "value": value, "wall_time": wall_time})
        sep = ","
    yield "]}"


EXPORT_PARAMS = [OpenApiParameter("keys", str, description="Comma-separated keys (default: all).")]


class RunMetricsCsvView(JsonOnly, APIView):
    @extend_schema(parameters=EXPORT_PARAMS, responses={(200, "text/csv"): OpenApiTypes.STR})
    def get(self, request: Request, run_id: int) -> StreamingHttpResponse:
        run = _readable_run(request, run_id)
        resp = StreamingHttpResponse(_csv_lines(run.pk, _keys_param(request)), content_type="text/csv")
        resp["Content-Disposition"] = f'attachment; filename="run-{run.pk}-metrics.csv"'
        return resp


class RunMetricsJsonView(JsonOnly, APIView):
    @extend_schema(parameters=EXPORT_PARAMS, responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request, run_id: int) -> StreamingHttpResponse:
        run = _readable_run(request, run_id)
        resp = StreamingHttpResponse(
            _json_chunks(run.pk, _keys_param(request)), content_type="application/json"
        )
        resp["Content-Disposition"] = f'attachment; filename="run-{run.pk}-metrics.json"'
        return resp

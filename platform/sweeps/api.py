"""Sweeps: create (a grid or random search over config fields of an experiment), list, detail with its
runs ranked by the metric, cancel. Roles (docs/api.md): every member reads; a member creates and cancels.
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, generics, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.access import require_role
from accounts.models import Role
from accounts.parsers import JsonOnly, query_int, query_str
from experiments.selectors import visible_experiments
from sweeps import selectors, services
from sweeps.models import Summary, Sweep
from sweeps.serializers import SweepCreateSerializer, SweepDetailSerializer, SweepSerializer

PROJECT_Q = OpenApiParameter("project", int, description="Only this project.")
EXPERIMENT_Q = OpenApiParameter("experiment", int, description="Only sweeps of this base experiment.")
SUMMARY_Q = OpenApiParameter(
    "summary",
    str,
    enum=list(Summary.values),
    description="Rank by the last or the best value (default: the sweep's).",
)


def _invalid(exc: services.SweepInvalid) -> exceptions.ValidationError:
    out: dict[str, list[str]] = {}
    for field, msg in exc.errors:
        out.setdefault(field, []).append(msg)
    return exceptions.ValidationError(out)


def _detail(sweep: Sweep, summary: str | None) -> dict:
    ranked = selectors.sweep_runs_ranked(sweep, summary)
    return SweepDetailSerializer(sweep, context={"summary": summary, "ranked": ranked}).data


class SweepListView(JsonOnly, generics.ListAPIView):
    serializer_class = SweepSerializer

    @extend_schema(parameters=[PROJECT_Q, EXPERIMENT_Q])
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[Sweep]:
        qs = selectors.visible_sweeps(self.request)
        for name in ("project", "experiment"):
            if (value := query_int(self.request, name, minimum=1)) is not None:
                qs = qs.filter(**{f"{name}_id": value})
        return qs

    @extend_schema(
        request=SweepCreateSerializer,
        responses={
            201: SweepDetailSerializer,
            400: OpenApiResponse(
                description="Field paths: search_space.<config path> (a bad spec, a distribution in a grid, "
                "or a point whose config the engine's schema or the platform's policy refuses: the message "
                "names the point), max_runs, experiment (its config is no longer valid), ..."
            ),
        },
        description="Validate every point, then create the sweep and its runs (queued); the launcher starts "
        "at most max_concurrent of them at a time, in the admission queue's priority order.",
    )
    def post(self, request: Request) -> Response:
        ser = SweepCreateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        experiment = get_object_or_404(visible_experiments(request), pk=data["experiment"])
        require_role(request, experiment.project_id, Role.MEMBER)
        early = data.get("early_stopping")
        spec = services.SweepSpec(
            name=data.get("name") or f"{experiment.name} sweep"[:200],
            method=data["method"],
            search_space=data["search_space"],
            metric=data["metric"],
            max_runs=data.get("max_runs"),
            max_concurrent=data["max_concurrent"],
            goal=data["goal"],
            summary=data["summary"],
            early_stopping=services.EarlyStopping(**early) if early else None,
            seed=data.get("seed"),
            priority=data["priority"],
        )
        try:
            sweep = services.sweep_create(experiment=experiment, user=request.user, spec=spec)
        except services.SweepInvalid as exc:
            raise _invalid(exc) from None
        return Response(_detail(sweep, None), status=status.HTTP_201_CREATED)


def _summary_param(request: Request) -> str | None:
    summary = query_str(request, "summary")
    if summary and summary not in Summary.values:
        raise exceptions.ValidationError({"summary": [f"must be one of {', '.join(Summary.values)}"]})
    return summary or None


class SweepDetailView(JsonOnly, APIView):
    @extend_schema(parameters=[SUMMARY_Q], responses={200: SweepDetailSerializer})
    def get(self, request: Request, pk: int) -> Response:
        sweep = get_object_or_404(selectors.visible_sweeps(request), pk=pk)
        return Response(_detail(sweep, _summary_param(request)))


class SweepCancelView(JsonOnly, APIView):
    @extend_schema(request=None, responses={200: SweepDetailSerializer})
    def post(self, request: Request, pk: int) -> Response:
        sweep = get_object_or_404(selectors.visible_sweeps(request), pk=pk)
        require_role(request, sweep.project_id, Role.MEMBER)
        sweep = services.sweep_cancel(sweep=sweep, user=request.user)
        return Response(_detail(sweep, None))

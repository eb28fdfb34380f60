"""Experiments (CRUD, clone, YAML in/out), the config JSON Schema, presets, and runs (launch, cancel, resume)."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, generics, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.access import Conflict, require_role, visible_project_ids
from accounts.ids import parse_db_id
from accounts.models import Project, Role
from accounts.parsers import JsonOnly, query_int, query_str
from experiments import engine_catalogue, services
from experiments.config_policy import CheckpointRefused, platform_presets, preset_document
from experiments.form_schema import form_schema
from experiments.model_catalogue import catalogue_document
from experiments.models import Experiment, Run, RunState
from experiments.selectors import runs_compared, stored_config, visible_experiments, visible_runs, with_tag
from experiments.serializers import (
    CloneSerializer,
    ExperimentListSerializer,
    ExperimentSerializer,
    ForkSerializer,
    ResumeSerializer,
    RunCompareSerializer,
    RunCreateSerializer,
    RunListSerializer,
    RunSerializer,
    YamlImportSerializer,
    config_error_dict,
    fork_error_dict,
)
from rl_engine import presets
from rl_engine.config import ConfigError, experiment_json_schema


def _config_refused(exc: ConfigError, prefix: str = "config") -> exceptions.ValidationError:
    """A config the engine's schema or the platform's policy refuses: a 400 naming the fields."""
    return exceptions.ValidationError(config_error_dict(exc, prefix=prefix))


def _int_param(request: Request, name: str) -> int | None:
    return query_int(request, name, minimum=1)


PROJECT_Q = OpenApiParameter("project", int, description="Only this project.")
TAG_Q = OpenApiParameter("tag", str, description="Only experiments carrying this tag.")


class ExperimentListView(JsonOnly, generics.ListCreateAPIView):
    def get_serializer_class(self):
        return ExperimentListSerializer if self.request.method == "GET" else ExperimentSerializer

    @extend_schema(parameters=[PROJECT_Q, TAG_Q], responses=ExperimentListSerializer(many=True))
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(request=ExperimentSerializer, responses={201: ExperimentSerializer})
    def post(self, request: Request, *args, **kwargs) -> Response:
        return super().post(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[Experiment]:
        qs = visible_experiments(self.request)
        project = _int_param(self.request, "project")
        if project is not None:
            qs = qs.filter(project_id=project)
        tag = query_str(self.request, "tag")
        if tag:
            qs = with_tag(qs, tag)
        return qs

    def perform_create(self, serializer: ExperimentSerializer) -> None:
        data = serializer.validated_data
        require_role(self.request, data["project_id"], Role.MEMBER)
        try:
            serializer.instance = services.experiment_create(
                project=Project.objects.get(pk=data["project_id"]),
                user=self.request.user,
                name=data["name"],
                description=data.get("description", ""),
                tags=data.get("tags", []),
                config=data["config"],
            )
        except ConfigError as exc:
            raise _config_refused(exc) from None


class ExperimentDetailView(JsonOnly, generics.RetrieveUpdateDestroyAPIView):
    serializer_class = ExperimentSerializer
    http_method_names = ["get", "put", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[Experiment]:
        return visible_experiments(self.request)

    def get_object(self) -> Experiment:
        obj = super().get_object()
        if self.request.method not in ("GET", "HEAD", "OPTIONS"):
            require_role(self.request, obj.project_id, Role.MEMBER)
        return obj

    def perform_update(self, serializer: ExperimentSerializer) -> None:
        fields = {k: v for k, v in serializer.validated_data.items() if k != "project_id"}
        try:
            serializer.instance = services.experiment_update(experiment=serializer.instance, **fields)
        except ConfigError as exc:
            raise _config_refused(exc) from None

    def perform_destroy(self, instance: Experiment) -> None:
        try:
            services.experiment_delete(experiment=instance)
        except services.ExperimentInUse as exc:
            raise Conflict(str(exc)) from None


class ExperimentCloneView(JsonOnly, APIView):
    @extend_schema(request=CloneSerializer, responses={201: ExperimentSerializer})
    def post(self, request: Request, pk: int) -> Response:
        source = get_object_or_404(visible_experiments(request), pk=pk)
        require_role(request, source.project_id, Role.MEMBER)
        ser = CloneSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        clone = services.experiment_clone(
            experiment=source, user=request.user, name=ser.validated_data.get("name")
        )
        return Response(ExperimentSerializer(clone).data, status=status.HTTP_201_CREATED)


class ExperimentYamlView(JsonOnly, APIView):
    @extend_schema(responses={(200, "application/yaml"): OpenApiTypes.STR})
    def get(self, request: Request, pk: int) -> HttpResponse:
        exp = get_object_or_404(visible_experiments(request), pk=pk)
        resp = HttpResponse(
            services.config_to_yaml(exp.config), content_type="application/yaml; charset=utf-8"
        )
        resp["Content-Disposition"] = f'attachment; filename="experiment-{exp.pk}.yaml"'
        return resp


class ExperimentImportView(JsonOnly, APIView):
    @extend_schema(
        request=YamlImportSerializer,
        responses={201: ExperimentSerializer},
        description="Create an experiment from YAML text (e.g. a file exported with GET .../yaml).",
    )
    def post(self, request: Request) -> Response:
        ser = YamlImportSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        require_role(request, data["project"], Role.MEMBER)
        try:
            exp = services.experiment_create(
                project=Project.objects.get(pk=data["project"]),
                user=request.user,
                name=data["name"],
                config=services.config_from_yaml(data["yaml"]),
                description=data["description"],
                tags=data["tags"],
            )
        except ConfigError as exc:
            raise _config_refused(exc, prefix="yaml") from None
        return Response(ExperimentSerializer(exp).data, status=status.HTTP_201_CREATED)


SCHEMA_PROJECT_Q = OpenApiParameter(
    "project",
    int,
    description="The form's schema for this project: the engine's, narrowed by this platform's policy "
    "(refused fields absent, the model catalogue and allowed servers as choices, cluster fields grouped). "
    "Without it: the engine's own schema.",
)


class ExperimentSchemaView(JsonOnly, APIView):
    """The JSON Schema of an experiment config: the engine's, or (``?project=ID``) the form a project's
    members write experiments with (``experiments.form_schema``)."""

    permission_classes = [AllowAny]

    @extend_schema(
        parameters=[SCHEMA_PROJECT_Q],
        responses={
            200: OpenApiTypes.OBJECT,
            400: OpenApiResponse(description="project is not a positive integer."),
            401: OpenApiResponse(description="A project's form needs credentials."),
            404: OpenApiResponse(description="No such project among yours."),
        },
    )
    def get(self, request: Request) -> Response:
        project_id = _int_param(request, "project")
        if project_id is None:
            return Response(experiment_json_schema())
        if not request.user or not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        require_role(request, project_id, Role.VIEWER)
        return Response(form_schema(Project.objects.get(pk=project_id)))


class PresetListView(JsonOnly, APIView):
    permission_classes = [AllowAny]

    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        operation_id="presets_list",
        description="{name: config} for every preset the engine ships, as this platform accepts it "
        "(a tiny model is built under the first model root).",
    )
    def get(self, request: Request) -> Response:
        return Response(platform_presets())


class PresetDetailView(JsonOnly, APIView):
    permission_classes = [AllowAny]

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 404: OpenApiResponse(description="No such preset.")})
    def get(self, request: Request, name: str) -> Response:
        if name not in presets.preset_names():
            raise exceptions.NotFound(
                f"no preset {name!r}; choose one of {', '.join(presets.preset_names())}"
            )
        return Response(preset_document(name))


class ModelListView(JsonOnly, APIView):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        operation_id="models_list",
        description="The models a config may name here (``model.path``): every model directory under "
        "MODEL_ROOTS and each local one of ALLOWED_MODELS, with parameters, vocabulary, head size, chat "
        "template, the rollout backends that can serve it and its card; and the engine's catalogue models "
        "not fetched yet (``not_fetched``: the command an operator runs). Absolute paths only to a "
        "member of some project (others: the root's folder name, then the model's folder under it).",
    )
    def get(self, request: Request) -> Response:
        return Response(catalogue_document(full_paths=bool(visible_project_ids(request))))


class EngineUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The engine's environment did not answer."
    default_code = "engine_unavailable"


def _engine_catalogue(kind: str) -> dict:
    try:
        return engine_catalogue.catalogue(kind)
    except engine_catalogue.CatalogueUnavailable as exc:
        raise EngineUnavailable(str(exc)) from None


class RewardListView(JsonOnly, APIView):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT, 503: OpenApiResponse(description="The engine did not answer.")},
        operation_id="rewards_list",
        description="The rewards a config may name (``reward.name``, ``reward.combine[i].name``), as the "
        "engine's environment (ENGINE_PYTHON) lists them: ``rewards``, each with its name, description, "
        "parameters (name, type, default, required), origin (``builtin``, or ``plugin`` with the package "
        "and version; ``error`` when the plugin does not load there); ``refused``: plugins not offered "
        "(a name that shadows a built-in). Cached for a minute.",
    )
    def get(self, request: Request) -> Response:
        return Response(_engine_catalogue("rewards"))


class TaskListView(JsonOnly, APIView):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT, 503: OpenApiResponse(description="The engine did not answer.")},
        operation_id="tasks_list",
        description="The built-in tasks (``data.task`` of ``data.source: task``) as the engine's "
        "environment lists them: ``tasks``, each with its name, description, parameters "
        "(``data.task_kwargs``: name, type, default) and origin. Cached for a minute.",
    )
    def get(self, request: Request) -> Response:
        return Response(_engine_catalogue("tasks"))


STATE_Q = OpenApiParameter(
    "state", str, description=f"Comma-separated states among {', '.join(RunState.values)}."
)
EXPERIMENT_Q = OpenApiParameter("experiment", int, description="Only runs of this experiment.")


class RunListView(JsonOnly, generics.ListAPIView):
    serializer_class = RunListSerializer

    def get_queryset(self) -> QuerySet[Run]:
        qs = visible_runs(self.request)
        for name in ("project", "experiment"):
            value = _int_param(self.request, name)
            if value is not None:
                qs = qs.filter(**{f"{name}_id": value})
        states = [s for s in self.request.query_params.get("state", "").split(",") if s]
        unknown = sorted(set(states) - set(RunState.values))
        if unknown:
            raise exceptions.ValidationError({"state": [f"unknown state(s) {', '.join(unknown)}"]})
        if states:
            qs = qs.filter(state__in=states)
        tag = query_str(self.request, "tag")
        if tag:
            exp_ids = with_tag(visible_experiments(self.request), tag).values_list("pk", flat=True)
            qs = qs.filter(experiment_id__in=list(exp_ids))
        return qs

    @extend_schema(parameters=[STATE_Q, TAG_Q, EXPERIMENT_Q, PROJECT_Q])
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=RunCreateSerializer,
        responses={201: RunSerializer},
        description="Launch: freeze the experiment's config into a queued run; the launcher starts it.",
    )
    def post(self, request: Request) -> Response:
        ser = RunCreateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        exp = get_object_or_404(visible_experiments(request), pk=ser.validated_data["experiment"])
        require_role(request, exp.project_id, Role.MEMBER)
        try:
            run = services.run_create(
                experiment=exp, user=request.user, priority=ser.validated_data["priority"]
            )
        except ConfigError as exc:  # no longer valid (engine schema) or allowed (policy, project rights)
            raise _config_refused(exc) from None
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)


class RunDetailView(JsonOnly, generics.RetrieveAPIView):
    serializer_class = RunSerializer

    def get_queryset(self) -> QuerySet[Run]:
        return visible_runs(self.request)


def _run_for_write(request: Request, pk: int) -> Run:
    run = get_object_or_404(visible_runs(request), pk=pk)
    require_role(request, run.project_id, Role.MEMBER)
    return run


class RunCancelView(JsonOnly, APIView):
    @extend_schema(
        request=None, responses={200: RunSerializer, 409: OpenApiResponse(description="Already finished.")}
    )
    def post(self, request: Request, pk: int) -> Response:
        run = _run_for_write(request, pk)
        try:
            run = services.run_request_cancel(run=run, user=request.user)
        except services.InvalidTransition as exc:
            raise Conflict(f"run {run.pk} is {exc.current}: nothing to cancel") from None
        return Response(RunSerializer(run).data)


class RunResumeView(JsonOnly, APIView):
    @extend_schema(
        request=ResumeSerializer,
        responses={
            201: RunSerializer,
            400: OpenApiResponse(
                description="The platform's policy refuses the run's config, or its checkpoint "
                "(resumed_from_checkpoint: not in the run's own checkpoint folder)."
            ),
            409: OpenApiResponse(description="The run is still active or has no checkpoint."),
        },
    )
    def post(self, request: Request, pk: int) -> Response:
        run = _run_for_write(request, pk)
        ser = ResumeSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        try:
            new = services.run_resume(run=run, user=request.user, priority=ser.validated_data.get("priority"))
        except services.InvalidTransition as exc:
            raise Conflict(f"run {run.pk} is {exc.current}: only a finished run can be resumed") from None
        except services.NoCheckpoint as exc:
            raise Conflict(str(exc)) from None
        except ConfigError as exc:
            raise _config_refused(exc) from None
        except CheckpointRefused as exc:
            raise exceptions.ValidationError({"resumed_from_checkpoint": [str(exc)]}) from None
        return Response(RunSerializer(new).data, status=status.HTTP_201_CREATED)


# --- Config diff of runs: GET /api/runs/compare?ids=1,2,3 ---------------------------------------------

COMPARE_MAX_IDS = 20
IDS_Q = OpenApiParameter(
    "ids",
    str,
    required=True,
    description=f"Comma-separated ids of 1 to {COMPARE_MAX_IDS} different runs, e.g. 1,2,3.",
)


def compare_ids(request: Request) -> list[int]:
    """The ``ids`` parameter: distinct positive run ids, 1 to COMPARE_MAX_IDS of them; else a 400 at ``ids``."""

    def refuse(message: str) -> exceptions.ValidationError:
        return exceptions.ValidationError({"ids": [message]})

    raw = ",".join(request.query_params.getlist("ids"))
    if not raw.strip(" ,"):
        raise refuse(f"required: comma-separated run ids (1 to {COMPARE_MAX_IDS}), e.g. ids=1,2,3")
    items = [item.strip() for item in raw.split(",")]
    if len(items) > COMPARE_MAX_IDS:
        raise refuse(f"at most {COMPARE_MAX_IDS} runs can be compared, got {len(items)}")
    ids: list[int] = []
    for item in items:
        run_id = parse_db_id(item)
        if run_id is None:
            shown = item if len(item) <= 30 else item[:30] + "…"
            raise refuse(f"{shown!r} is not a run id (a positive integer)")
        ids.append(run_id)
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise refuse(f"each run may be listed once; repeated: {', '.join(map(str, repeated))}")
    return ids


class RunCompareView(JsonOnly, APIView):
    @extend_schema(
        operation_id="runs_compare",
        parameters=[IDS_Q],
        responses={
            200: RunCompareSerializer,
            400: OpenApiResponse(description="ids missing, not run ids, repeated, or more than 20."),
            404: OpenApiResponse(description="A run that does not exist or is not in your projects."),
        },
        description="How the runs' configs differ: every leaf field (a dotted path; a list is one value) "
        "whose value is not the same in all the runs, with each run's value; a run lacking the field is "
        "listed in `absent`, never given a null. Each run is compared by its stored config validated with "
        "the engine's schema (defaults explicit), or, where that no longer parses, as stored "
        "(`config_basis`, `config_problem`).",
    )
    def get(self, request: Request) -> Response:
        ids = compare_ids(request)
        found = {r.pk: r for r in visible_runs(request).select_related("project").filter(pk__in=ids)}
        missing = [i for i in ids if i not in found]
        if missing:
            raise exceptions.NotFound(f"no run {', '.join(map(str, missing))} in your projects")
        comparison = runs_compared([found[i] for i in ids])
        return Response(RunCompareSerializer(comparison).data)


# --- fork ----------------------------------------------------------------------------------------------


class RunForkView(JsonOnly, APIView):
    """A resume with knobs: from a chosen checkpoint of the run, with a changed config."""

    @extend_schema(
        request=ForkSerializer,
        responses={
            201: RunSerializer,
            400: OpenApiResponse(
                description="Field paths: config_overrides.<path> (an invalid value, an unknown field, a "
                "change of the model section or of pipeline.num_rollouters, a value the platform's policy "
                "refuses), config.<path> (the run's own config is refused now), checkpoint (not one of "
                "the run's checkpoints)."
            ),
            409: OpenApiResponse(description="The run is still active, or has no checkpoint."),
        },
    )
    def post(self, request: Request, pk: int) -> Response:
        run = _run_for_write(request, pk)
        try:
            parent = stored_config(run)
        except ConfigError as exc:
            raise _config_refused(exc) from None
        ser = ForkSerializer(data=request.data, context={"parent": parent})
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        try:
            new = services.run_resume(
                run=run,
                user=request.user,
                priority=data.get("priority"),
                checkpoint_id=data.get("checkpoint"),
                config=data["config"],
            )
        except services.InvalidTransition as exc:
            raise Conflict(f"run {run.pk} is {exc.current}: only a finished run can be forked") from None
        except services.NoCheckpoint as exc:
            raise Conflict(str(exc)) from None
        except ConfigError as exc:
            raise exceptions.ValidationError(fork_error_dict(exc, data["config_overrides"])) from None
        except CheckpointRefused as exc:
            raise exceptions.ValidationError({"checkpoint": [str(exc)]}) from None
        return Response(RunSerializer(new).data, status=status.HTTP_201_CREATED)

"""Alerts (list, resolve), metric rules (CRUD) and webhooks (CRUD, delivery log) of projects.

Roles (docs/api.md): every member reads alerts and rules; a member resolves alerts and manages rules;
only an owner sees and manages a project's webhooks (their URLs and secrets, the requests the platform
makes for the project).
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, generics, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.access import require_role
from accounts.models import Project, Role
from accounts.parsers import JsonOnly, query_int
from accounts.throttles import project_throttle
from alerts import selectors, services, url_guard
from alerts.models import Alert, MetricRule, Webhook, WebhookDelivery
from alerts.serializers import (
    AlertSerializer,
    MetricRuleSerializer,
    WebhookCreatedSerializer,
    WebhookDeliverySerializer,
    WebhookSerializer,
)

PROJECT_Q = OpenApiParameter("project", int, description="Only this project.")
RUN_Q = OpenApiParameter("run", int, description="Only this run.")
OPEN_Q = OpenApiParameter("open", int, enum=[0, 1], description="1: only open alerts; 0: only resolved ones.")


def _url_refused(exc: url_guard.UrlRefused) -> exceptions.ValidationError:
    return exceptions.ValidationError({"url": [str(exc)]})


def _limit_reached(exc: services.LimitReached) -> exceptions.ValidationError:
    return exceptions.ValidationError({"project": [str(exc)]})


class AlertListView(JsonOnly, generics.ListAPIView):
    serializer_class = AlertSerializer

    @extend_schema(parameters=[PROJECT_Q, RUN_Q, OPEN_Q])
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[Alert]:
        qs = selectors.visible_alerts(self.request)
        if (project := query_int(self.request, "project", minimum=1)) is not None:
            qs = qs.filter(project_id=project)
        if (run := query_int(self.request, "run", minimum=1)) is not None:
            qs = qs.filter(run_id=run)
        if (only_open := query_int(self.request, "open", minimum=0, maximum=1)) is not None:
            qs = qs.filter(resolved_at__isnull=bool(only_open))
        return qs


class AlertResolveView(JsonOnly, APIView):
    @extend_schema(request=None, responses={200: AlertSerializer})
    def post(self, request: Request, pk: int) -> Response:
        alert = get_object_or_404(selectors.visible_alerts(request), pk=pk)
        require_role(request, alert.project_id, Role.MEMBER)
        project_throttle("alert_resolve", alert.project_id)  # a resolved alert opens again: deliveries
        alert = services.alert_resolve(alert=alert, user=request.user)
        return Response(AlertSerializer(alert).data)


class MetricRuleListView(JsonOnly, generics.ListCreateAPIView):
    serializer_class = MetricRuleSerializer

    @extend_schema(parameters=[PROJECT_Q])
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[MetricRule]:
        qs = selectors.visible_rules(self.request)
        if (project := query_int(self.request, "project", minimum=1)) is not None:
            qs = qs.filter(project_id=project)
        return qs

    def perform_create(self, serializer: MetricRuleSerializer) -> None:
        data = serializer.validated_data
        require_role(self.request, data["project_id"], Role.MEMBER)
        project_throttle("alert_rule_writes", data["project_id"])
        try:
            serializer.instance = services.rule_create(
                project=Project.objects.get(pk=data["project_id"]),
                spec=services.RuleSpec(
                    metric=data["metric"],
                    kind=data["kind"],
                    steps=data["steps"],
                    goal=data["goal"],
                    active=data.get("active", True),
                ),
                user=self.request.user,
            )
        except services.LimitReached as exc:
            raise _limit_reached(exc) from None


class MetricRuleDetailView(JsonOnly, generics.RetrieveUpdateDestroyAPIView):
    serializer_class = MetricRuleSerializer
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[MetricRule]:
        return selectors.visible_rules(self.request)

    def perform_update(self, serializer: MetricRuleSerializer) -> None:
        require_role(self.request, serializer.instance.project_id, Role.MEMBER)
        project_throttle("alert_rule_writes", serializer.instance.project_id)  # a change re-reads its runs
        changes = {k: v for k, v in serializer.validated_data.items() if k != "project_id"}
        serializer.instance = services.rule_update(rule=serializer.instance, changes=changes)

    def perform_destroy(self, instance: MetricRule) -> None:
        require_role(self.request, instance.project_id, Role.MEMBER)
        project_throttle("alert_rule_writes", instance.project_id)
        services.rule_delete(rule=instance)


class WebhookListView(JsonOnly, generics.ListCreateAPIView):
    """A project's webhooks: listed for the projects you own."""

    serializer_class = WebhookSerializer

    @extend_schema(parameters=[PROJECT_Q])
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(request=WebhookSerializer, responses={201: WebhookCreatedSerializer})
    def post(self, request: Request, *args, **kwargs) -> Response:
        serializer = WebhookSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        require_role(request, data["project_id"], Role.OWNER)
        project_throttle("webhook_writes", data["project_id"])
        try:
            hook = services.webhook_create(
                project=Project.objects.get(pk=data["project_id"]),
                url=data["url"],
                secret=data.get("secret", ""),
                events=data.get("events"),
                user=request.user,
            )
        except url_guard.UrlRefused as exc:
            raise _url_refused(exc) from None
        except services.LimitReached as exc:
            raise _limit_reached(exc) from None
        return Response(WebhookCreatedSerializer(hook).data, status=status.HTTP_201_CREATED)

    def get_queryset(self) -> QuerySet[Webhook]:
        qs = selectors.owned_webhooks(self.request)
        if (project := query_int(self.request, "project", minimum=1)) is not None:
            qs = qs.filter(project_id=project)
        return qs


class WebhookDetailView(JsonOnly, generics.RetrieveUpdateDestroyAPIView):
    serializer_class = WebhookSerializer
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[Webhook]:
        return selectors.visible_webhooks(self.request)

    def get_object(self) -> Webhook:
        hook = super().get_object()
        require_role(self.request, hook.project_id, Role.OWNER)
        return hook

    def perform_update(self, serializer: WebhookSerializer) -> None:
        project_throttle("webhook_writes", serializer.instance.project_id)
        changes = {k: v for k, v in serializer.validated_data.items() if k != "project_id"}
        try:
            serializer.instance = services.webhook_update(webhook=serializer.instance, changes=changes)
        except url_guard.UrlRefused as exc:
            raise _url_refused(exc) from None

    def perform_destroy(self, instance: Webhook) -> None:
        project_throttle("webhook_writes", instance.project_id)
        services.webhook_delete(webhook=instance)


class WebhookDeliveryListView(JsonOnly, generics.ListAPIView):
    """The webhook's delivery log, newest first."""

    serializer_class = WebhookDeliverySerializer

    def get_queryset(self) -> QuerySet[WebhookDelivery]:
        hook = get_object_or_404(selectors.visible_webhooks(self.request), pk=self.kwargs["pk"])
        require_role(self.request, hook.project_id, Role.OWNER)
        return selectors.webhook_deliveries(hook)

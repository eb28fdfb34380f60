"""Health endpoint: which deployment this is and whether a worker answered recently."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.selectors import health_summary


class HealthView(APIView):
    """200 while this web process can reach its database and its Celery broker (a load balancer's or
    compose's health check); 503 when either does not answer. Never redirected to HTTPS
    (SECURE_REDIRECT_EXEMPT)."""

    permission_classes = [AllowAny]
    authentication_classes: list = []

    @extend_schema(
        responses=inline_serializer(
            "Health",
            fields={
                "database": serializers.CharField(),
                "database_ok": serializers.BooleanField(),
                "broker": serializers.CharField(),
                "broker_ok": serializers.BooleanField(),
                "live_bus": serializers.CharField(),
                "last_worker_ping": serializers.DateTimeField(allow_null=True),
                "worker_hostname": serializers.CharField(allow_null=True),
                "last_sweep": serializers.DateTimeField(allow_null=True),
            },
        ),
        description=(
            "503 (database_ok or broker_ok false) when the database or the Celery broker does not "
            "answer. last_worker_ping: a worker's latest answer (a ping, or a periodic sweep it ran) in "
            "the last 5 minutes; last_sweep: the latest periodic sweep (beat and a worker alive)."
        ),
    )
    def get(self, request: Request) -> Response:
        summary = health_summary()
        ok = summary["database_ok"] and summary["broker_ok"]
        return Response(summary, status=200 if ok else 503)

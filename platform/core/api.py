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
    """200 while this web process can reach its database (a load balancer's or compose's health check);
    503 when it cannot. Never redirected to HTTPS (SECURE_REDIRECT_EXEMPT)."""

    permission_classes = [AllowAny]
    authentication_classes: list = []

    @extend_schema(
        responses=inline_serializer(
            "Health",
            fields={
                "database": serializers.CharField(),
                "database_ok": serializers.BooleanField(),
                "broker": serializers.CharField(),
                "channel_layer": serializers.CharField(),
                "last_worker_ping": serializers.DateTimeField(allow_null=True),
                "worker_hostname": serializers.CharField(allow_null=True),
            },
        ),
        description="503 (with database_ok false) when the database does not answer.",
    )
    def get(self, request: Request) -> Response:
        summary = health_summary()
        return Response(summary, status=200 if summary["database_ok"] else 503)

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
    permission_classes = [AllowAny]
    authentication_classes: list = []

    @extend_schema(
        responses=inline_serializer(
            "Health",
            fields={
                "database": serializers.CharField(),
                "broker": serializers.CharField(),
                "channel_layer": serializers.CharField(),
                "last_worker_ping": serializers.DateTimeField(allow_null=True),
                "worker_hostname": serializers.CharField(allow_null=True),
            },
        )
    )
    def get(self, request: Request) -> Response:
        return Response(health_summary())

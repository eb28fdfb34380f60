"""One error shape for the whole API: ``{"detail": str, "errors": {field.path: [messages]}}``.

Never lets an exception become an HTML 500 page for an API client: unexpected errors are logged and
answered with a JSON 500 (which tests treat as a bug).
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RequestDataTooBig):  # Django refuses to buffer a body over the upload limit
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {"detail": f"The request body is larger than the limit of {limit} bytes: split it."},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, SuspiciousOperation):  # e.g. too many fields: the client's fault, never a 500
        return Response({"detail": f"Bad request: {exc}"}, status=status.HTTP_400_BAD_REQUEST)
    response = drf_exception_handler(exc, context)
    if response is None:
        view = context.get("view")
        logging.getLogger("api").exception(
            "unhandled error in %s", type(view).__name__ if view else "API view"
        )
        return Response({"detail": "Internal server error."}, status=status.HTTP_500_INTERNAL_SERVER_ERROR)
    data = response.data
    if isinstance(data, dict) and "detail" in data and len(data) == 1:
        return response
    if isinstance(data, dict | list):
        response.data = {"detail": "Invalid input.", "errors": data}
    return response

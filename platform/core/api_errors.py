"""One error shape for the whole API: ``{"detail": str, "errors": {field.path: [messages]}}``.

Never lets an exception become an HTML 500 page for an API client: unexpected errors are logged and
answered with a JSON 500 (which tests treat as a bug).
"""

from __future__ import annotations

import logging
from typing import Any

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = drf_exception_handler(exc, context)
    if response is None:
        view = context.get("view")
        logging.getLogger("api").exception("unhandled error in %s", type(view).__name__ if view else "API view")
        return Response({"detail": "Internal server error."}, status=status.HTTP_500_INTERNAL_SERVER_ERROR)
    data = response.data
    if isinstance(data, dict) and "detail" in data and len(data) == 1:
        return response
    if isinstance(data, dict | list):
        response.data = {"detail": "Invalid input.", "errors": data}
    return response

"""API clients never get an HTML error page: an unexpected exception becomes a JSON 500."""

from __future__ import annotations

from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView


class Exploding(APIView):
    authentication_classes: list = []
    permission_classes: list = []

    def get(self, request):
        raise RuntimeError("boom")


def test_unexpected_error_is_a_json_500():
    response = Exploding.as_view()(APIRequestFactory().get("/x"))
    assert response.status_code == 500
    assert response.data == {"detail": "Internal server error."}

"""Session login with rate limits (accounts.throttles): the site's login page and the admin's."""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse

from accounts.throttles import login_wait_s


def _too_many(wait: int) -> str:
    return f"Too many login attempts: try again in {wait} s."


class LoginView(auth_views.LoginView):
    """Django's login page; beyond the login rates a POST is a 429 (the form says how long to wait)."""

    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        wait = login_wait_s(request)
        if wait is None:
            return super().post(request, *args, **kwargs)
        context = self.get_context_data(form=self.form_class(request), throttled=_too_many(wait))
        response = self.render_to_response(context, status=429)
        response["Retry-After"] = str(wait)
        return response


def login_throttled(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The same limits for another login view (the admin's)."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if request.method == "POST":
            wait = login_wait_s(request)
            if wait is not None:
                response = HttpResponse(_too_many(wait), status=429, content_type="text/plain; charset=utf-8")
                response["Retry-After"] = str(wait)
                return response
        return view(request, *args, **kwargs)

    return wrapped

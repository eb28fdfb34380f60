"""Session login with rate limits (accounts.throttles): the site's login page and the admin's."""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse

from accounts.throttles import StoreUnavailable, login_wait_s


def _too_many(wait: int) -> str:
    return f"Too many login attempts: try again in {wait} s."


def _store_away(wait: int) -> str:
    return f"Login is unavailable for a moment (its rate limits cannot be checked): try again in {wait} s."


def _gate(request: HttpRequest) -> tuple[int, int, str] | None:
    """(status, wait, message) of a login attempt that may not go ahead now, else None."""
    try:
        wait = login_wait_s(request)
    except StoreUnavailable as exc:
        return 503, exc.wait, _store_away(exc.wait)
    return None if wait is None else (429, wait, _too_many(wait))


class LoginView(auth_views.LoginView):
    """Django's login page; beyond the login rates a POST is a 429 (the form says how long to wait), a
    503 while the rates cannot be checked."""

    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        gate = _gate(request)
        if gate is None:
            return super().post(request, *args, **kwargs)
        code, wait, message = gate
        context = self.get_context_data(form=self.form_class(request), throttled=message)
        response = self.render_to_response(context, status=code)
        response["Retry-After"] = str(wait)
        return response


def login_throttled(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The same limits for another login view (the admin's)."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if request.method == "POST" and (gate := _gate(request)) is not None:
            code, wait, message = gate
            response = HttpResponse(message, status=code, content_type="text/plain; charset=utf-8")
            response["Retry-After"] = str(wait)
            return response
        return view(request, *args, **kwargs)

    return wrapped

"""Exceptions raised by the client. Every refusal of the API is an :class:`ApiError` carrying the HTTP
status, the API's ``detail`` and its ``errors`` (field path -> messages, e.g. ``config.trainer.lr``)."""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Base class of everything this package raises."""


class ConnectionFailed(ClientError):
    """The server could not be reached (after the retries an idempotent call gets)."""


class ApiError(ClientError):
    """The API answered with an error status.

    Attributes:
        status: the HTTP status code.
        detail: the API's one-line ``detail``.
        errors: ``{"field.path": ["message", ...]}`` (400s only; empty otherwise).
    """

    status: int = 0

    def __init__(self, status: int, detail: str, errors: dict[str, list[str]] | None = None) -> None:
        self.status = status
        self.detail = detail
        self.errors = dict(errors or {})
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """The first field error as ``path: message`` (or the detail): what a CLI prints."""
        for path, messages in self.errors.items():
            if messages:
                return f"{path}: {messages[0]}"
        return self.detail or f"HTTP {self.status}"

    @property
    def fields(self) -> list[str]:
        """The field paths the API named, in its order."""
        return list(self.errors)


class BadRequest(ApiError):
    """400: the request was refused as invalid; ``errors`` names the fields."""


class AuthenticationFailed(ApiError):
    """401: no, unknown, revoked or expired credentials."""


class PermissionDenied(ApiError):
    """403: the object is visible but the role does not allow the change."""


class NotFound(ApiError):
    """404: no such object in a project you belong to."""


class Conflict(ApiError):
    """409: the change conflicts with the object's state (e.g. cancel a finished run)."""


class PayloadTooLarge(ApiError):
    """413: the body exceeds a limit named in ``detail``."""


class RateLimited(ApiError):
    """429: beyond a rate limit; ``retry_after`` in seconds when the server said."""

    retry_after: float | None = None


class ServerError(ApiError):
    """5xx."""


class StreamRefused(ClientError):
    """The live stream was refused or closed by the server for good: 4401 (credentials refused) or 4403
    (not a member of the run's project, or no longer)."""

    def __init__(self, code: int, reason: str = "") -> None:
        self.code = code
        self.reason = reason
        what = {4401: "credentials refused", 4403: "not a member of the run's project"}.get(code, "refused")
        super().__init__(f"live stream {what} (close code {code}){': ' + reason if reason else ''}")


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: AuthenticationFailed,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: RateLimited,
}


def error_for(status: int, body: Any) -> ApiError:
    """The exception for an error answer; ``body`` is its parsed JSON (or text)."""
    detail, errors = "", {}
    if isinstance(body, dict):
        detail = str(body.get("detail") or "")
        raw = body.get("errors")
        if isinstance(raw, dict):
            errors = {str(k): [str(m) for m in (v if isinstance(v, list) else [v])] for k, v in raw.items()}
    elif isinstance(body, str):
        detail = body.strip().splitlines()[0][:300] if body.strip() else ""
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else ApiError)
    return cls(status, detail, errors)

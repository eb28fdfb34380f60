"""Request parsing shared by the platform's API views."""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.parsers import JSONParser
from rest_framework.request import Request


class NulSafeJSONParser(JSONParser):
    """JSON, minus strings holding U+0000: PostgreSQL text and jsonb cannot store that character, and a
    request must get a 400, not a database error. JSON can only carry it escaped, so the check is cheap."""

    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        if _has_nul(data):
            raise exceptions.ParseError("Strings must not contain the NUL character (\\u0000).")
        return data


def _has_nul(obj: object) -> bool:
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


API_PARSERS = [NulSafeJSONParser]  # the API speaks JSON only


def query_str(request: Request, name: str, max_length: int = 200) -> str | None:
    """A query parameter as text; NUL or an absurd length is a 400 (never a database error)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if "\x00" in raw or len(raw) > max_length:
        raise exceptions.ValidationError({name: [f"must be at most {max_length} characters, without NUL"]})
    return raw


def query_int(request: Request, name: str, *, minimum: int = 0, maximum: int = 2**62) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise exceptions.ValidationError({name: ["must be an integer"]}) from None
    if not minimum <= value <= maximum:
        raise exceptions.ValidationError({name: [f"must be between {minimum} and {maximum}"]})
    return value


class JsonOnly:
    """Mixin for API views: JSON bodies through the NUL-safe parser."""

    parser_classes = API_PARSERS

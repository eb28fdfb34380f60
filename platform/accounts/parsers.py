"""Request parsing shared by the platform's API views."""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.parsers import JSONParser
from rest_framework.request import Request

MAX_JSON_DEPTH = 64  # a config is ~4 levels deep; deeper bodies would only feed recursive code


class NulSafeJSONParser(JSONParser):
    """JSON, minus strings holding U+0000 (PostgreSQL text and jsonb cannot store that character) and
    minus nesting deeper than MAX_JSON_DEPTH (recursive code downstream -- validation, serialisation --
    must never hit Python's recursion limit): both are a 400, never a database error or a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:  # json's C decoder gives up on very deep nesting
            raise exceptions.ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels.") from None
        problem = _body_problem(data)
        if problem:
            raise exceptions.ParseError(problem)
        return data


def _body_problem(obj: object) -> str | None:
    """Why the parsed body is refused (NUL in a string, too deep), or None. Level by level: no recursion,
    and ~2 ms on a 5000-point batch (exact type checks: parsed JSON holds only the basic types)."""
    level, depth = [obj], 0
    while level:
        depth += 1
        below: list[object] = []
        extend = below.extend
        for item in level:
            kind = type(item)
            if kind is str:
                if "\x00" in item:
                    return "Strings must not contain the NUL character (\\u0000)."
            elif kind is dict or kind is list:
                if depth > MAX_JSON_DEPTH:
                    return f"JSON nested deeper than {MAX_JSON_DEPTH} levels."
                extend(item)
                if kind is dict:
                    extend(item.values())
        level = below
    return None


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

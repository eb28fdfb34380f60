"""Request parsing shared by the platform's API views."""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.parsers import JSONParser
from rest_framework.request import Request

from accounts.ids import parse_ascii_int
from rl_engine.safe_json import MAX_JSON_DEPTH, json_problem


class NulSafeJSONParser(JSONParser):
    """JSON whose every value the platform can store and list again (``rl_engine.safe_json``): no NUL, no lone
    surrogate, no number beyond the float range (``1e400``), nesting at most MAX_JSON_DEPTH (recursive
    code downstream must never hit Python's recursion limit). Each is a 400 naming the field, never a
    database error or a 500 (on insert or, worse, on every later read)."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:  # json's C decoder gives up on very deep nesting
            raise exceptions.ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels.") from None
        problem = json_problem(data)
        if problem:
            path, message = problem
            if not path:
                raise exceptions.ParseError(f"JSON {message}.")
            raise exceptions.ValidationError({path: [message]})
        return data


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
    value = parse_ascii_int(raw)  # ASCII digits only (int() also reads " 7", "+7", "1_0", Arabic-Indic)
    if value is None:
        raise exceptions.ValidationError({name: ["must be an integer"]})
    if not minimum <= value <= maximum:
        raise exceptions.ValidationError({name: [f"must be between {minimum} and {maximum}"]})
    return value


class JsonOnly:
    """Mixin for API views: JSON bodies through the NUL-safe parser."""

    parser_classes = API_PARSERS

"""The OpenAPI document describes the ingestion endpoints from the engine's wire models (rl_engine.wire):
the JSON Schema pydantic makes of them, in the document's dialect (OpenAPI 3.0: ``nullable`` rather than
a ``null`` type; integer and number formats like the serializers' fields). Registered with
drf-spectacular when the tracking app is ready."""

from __future__ import annotations

from typing import Any

from drf_spectacular.contrib.pydantic import PydanticExtension
from drf_spectacular.plumbing import ResolvedComponent
from pydantic.json_schema import model_json_schema

INT32_MAX = 2**31 - 1


def openapi_30(schema: Any) -> Any:
    """A JSON Schema (pydantic's) as an OpenAPI 3.0 schema object."""
    if isinstance(schema, list):
        return [openapi_30(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title":  # pydantic's field names again, title-cased: noise in the document
            continue
        if key == "properties":
            out[key] = {name: openapi_30(prop) for name, prop in value.items()}
        else:
            out[key] = openapi_30(value)
    options = out.get("anyOf")
    if isinstance(options, list) and {"type": "null"} in options and len(options) == 2:
        (other,) = [o for o in options if o != {"type": "null"}]
        del out["anyOf"]
        out = {**other, **out, "nullable": True}
    if out.get("type") == "integer" and out.get("maximum", 0) > INT32_MAX:
        out.setdefault("format", "int64")
    if out.get("type") == "number":
        out.setdefault("format", "double")
    return out


class WireModelExtension(PydanticExtension):
    """Requests are described as pydantic validates them (defaults optional, the first name of an
    alias), answers as they are serialised."""

    priority = 1  # over drf-spectacular's own pydantic extension

    def map_serializer(self, auto_schema: Any, direction: str) -> Any:
        mode = "validation" if direction == "request" else "serialization"
        schema = model_json_schema(self.target, ref_template="#/components/schemas/{model}", mode=mode)
        for name, sub in schema.pop("$defs", {}).items():
            component = ResolvedComponent(
                name=name, type=ResolvedComponent.SCHEMA, object=name, schema=openapi_30(sub)
            )
            auto_schema.registry.register_on_missing(component)
        return openapi_30(schema)

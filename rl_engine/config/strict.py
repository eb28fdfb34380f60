"""``StrictModel``: the base of every config section (pydantic; standard library and pydantic only)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Base: unknown keys are errors (a typo must not silently fall back to a default), and every float
    field is finite (``.inf`` or NaN is never a sensible size, rate or coefficient)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

"""``unit_conversion``: the response's last quantity, converted to its kind's base unit, against the
answer's (``2500 m`` answers ``2.5 km``). Standard library only; it imports nothing of rl_engine (the
sample is read by its attributes: ``response_text``, ``answer``)."""

from __future__ import annotations

import math
import re
from typing import Any

# unit -> (kind, factor to the kind's base unit)
UNITS: dict[str, tuple[str, float]] = {
    "mm": ("length", 0.001),
    "cm": ("length", 0.01),
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "in": ("length", 0.0254),
    "ft": ("length", 0.3048),
    "mi": ("length", 1609.344),
    "mg": ("mass", 0.001),
    "g": ("mass", 1.0),
    "kg": ("mass", 1000.0),
    "lb": ("mass", 453.59237),
    "ms": ("time", 0.001),
    "s": ("time", 1.0),
    "min": ("time", 60.0),
    "h": ("time", 3600.0),
    "ml": ("volume", 0.001),
    "l": ("volume", 1.0),
}
_QUANTITY = re.compile(r"(-?\d+(?:\.\d+)?(?:e-?\d+)?)\s*([A-Za-z]+)?\b", re.IGNORECASE)


def parse_quantity(text: str) -> tuple[float, str | None] | None:
    """The last quantity of ``text``: (value in the base unit, its kind), kind None for a bare number;
    None when there is no number (or the last one's unit is unknown)."""
    found = _QUANTITY.findall(text[-2000:])  # the answer is at the end: a bounded tail, whatever the length
    if not found:
        return None
    number, unit = found[-1]
    value = float(number)
    if not unit:
        return value, None
    known = UNITS.get(unit.lower())
    if known is None:
        return None
    kind, factor = known
    return value * factor, kind


def unit_conversion(rel_tol: float = 0.01, require_unit: bool = True) -> Any:
    """1.0 when the response's last quantity equals the answer's after unit conversion (within rel_tol).

    ``rel_tol``: the relative tolerance (0 to 1). ``require_unit``: a bare number never counts (else it is
    read in the answer's base unit). Returns ``{"score", "parsed", "rel_error"}``: ``parsed`` is 1.0 when
    the response held a quantity of the answer's kind, ``rel_error`` (only then) how far off it was.
    """
    if not isinstance(rel_tol, int | float) or isinstance(rel_tol, bool) or not 0.0 <= rel_tol <= 1.0:
        raise ValueError("rel_tol must be a number between 0 and 1")
    if not isinstance(require_unit, bool):
        raise ValueError("require_unit must be true or false")

    def score(sample: Any) -> dict[str, float]:
        want = parse_quantity(sample.answer)
        if want is None:
            raise ValueError(f"the answer {sample.answer[:80]!r} holds no quantity with a known unit")
        got = parse_quantity(sample.response_text)
        if got is None or (got[1] is None and require_unit) or (got[1] is not None and got[1] != want[1]):
            return {"score": 0.0, "parsed": 0.0}
        rel_error = abs(got[0] - want[0]) / max(abs(want[0]), 1e-12)
        ok = math.isclose(got[0], want[0], rel_tol=rel_tol, abs_tol=1e-12)
        return {"score": 1.0 if ok else 0.0, "parsed": 1.0, "rel_error": min(rel_error, 1e6)}

    return score

"""A sweep's search space: typed, pure (no Django), deterministic.

A search space maps dotted config paths (``trainer.lr``) to a spec:

- a list of values: grid values (``[1e-6, 3e-6]``); a random search draws one of them uniformly;
- ``{"choice": [...]}``: the same as a list;
- ``{"uniform": [a, b]}``, ``{"loguniform": [a, b]}`` (0 < a), ``{"int": [a, b]}`` (both ends included):
  distributions, for a random search only;
- the string forms ``"uniform(a, b)"``, ``"loguniform(a, b)"``, ``"int(a, b)"`` (at most
  ``MAX_SPEC_TEXT`` characters, read by :func:`parse_string_form` in one pass: no regular expression,
  whose backtracking made a long run of spaces cost seconds to hours of a web process).

A grid search is the Cartesian product of the lists (fields in sorted order, values in the order given);
a random search draws ``n`` points from ``random.Random(seed)``, the fields in sorted order, so that the
stored space (a JSON object whose key order a database need not keep) and the seed give the same points.
:class:`SearchSpaceError` carries ``(field, message)`` pairs.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass
from typing import Any, Literal

MAX_FIELDS = 20
MAX_VALUES = 100
PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,7}$")
MAX_SPEC_TEXT = 200  # "loguniform(1e-6, 1e-4)" is 22
DISTRIBUTIONS = ("uniform", "loguniform", "int")

Method = Literal["grid", "random"]
Point = dict[str, Any]  # dotted path -> value


class SearchSpaceError(ValueError):
    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{f}: {m}" if f else m for f, m in errors))


@dataclass(frozen=True)
class Values:
    """A discrete set of values (grid values, or a random search's uniform choice)."""

    values: tuple[Any, ...]


@dataclass(frozen=True)
class Distribution:
    kind: Literal["uniform", "loguniform", "int"]
    low: float
    high: float

    def sample(self, rng: random.Random) -> float | int:
        if self.kind == "int":
            return rng.randint(int(self.low), int(self.high))
        if self.kind == "loguniform":
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(self.low, self.high)


Spec = Values | Distribution


@dataclass(frozen=True)
class SearchSpace:
    fields: dict[str, Spec]  # sorted by path

    def grid_size(self) -> int:
        return math.prod(len(s.values) for s in self.fields.values() if isinstance(s, Values))


def parse_string_form(text: str) -> tuple[str, str, str] | None:
    """``"uniform(a, b)"`` -> ``("uniform", "a", "b")``: a distribution's name, ``(``, two non-empty
    arguments without ``,``, ``(`` or ``)``, then ``)``, with whitespace around each part. None for any
    other text. Linear in ``len(text)`` (string methods only)."""
    name, paren, rest = text.partition("(")
    name = name.strip()
    if not paren or name not in DISTRIBUTIONS:
        return None
    inside, close, tail = rest.partition(")")
    if not close or tail.strip() or "(" in inside:
        return None
    args = inside.split(",")
    if len(args) != 2:
        return None
    low, high = args[0].strip(), args[1].strip()
    if not low or not high:
        return None
    return name, low, high


def _shown(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _number(raw: Any) -> float | None:
    if isinstance(raw, bool):
        return None
    if not isinstance(raw, (int, float, str)):
        return None
    try:
        value = float(raw)  # an int beyond the float range (10**400) overflows
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _distribution(kind: str, bounds: Any) -> Distribution:
    if not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
        raise ValueError(f"{kind} takes two bounds [low, high]")
    low, high = _number(bounds[0]), _number(bounds[1])
    if low is None or high is None:
        raise ValueError(f"{kind}'s bounds must be finite numbers")
    if low > high:
        raise ValueError(f"{kind}: low ({low:g}) is above high ({high:g})")
    if kind == "uniform" and not math.isfinite(high - low):  # a draw low + (high - low) * u: infinity
        raise ValueError(f"uniform: the range from {low:g} to {high:g} is wider than a float holds")
    if kind == "loguniform" and low <= 0:
        raise ValueError("loguniform's bounds must be above 0")
    if kind == "int" and (low != int(low) or high != int(high)):
        raise ValueError("int's bounds must be whole numbers")
    return Distribution(kind, low, high)  # type: ignore[arg-type]


def _values(raw: Any) -> Values:
    if not isinstance(raw, list) or not raw:
        raise ValueError("give a non-empty list of values")
    if len(raw) > MAX_VALUES:
        raise ValueError(f"at most {MAX_VALUES} values")
    return Values(tuple(raw))


def parse_spec(raw: Any) -> Spec:
    """One field's spec; ValueError with a message for the user."""
    if isinstance(raw, list):
        return _values(raw)
    if isinstance(raw, str):
        if len(raw) > MAX_SPEC_TEXT:
            raise ValueError(
                f"a spec written as text has at most {MAX_SPEC_TEXT} characters (e.g. uniform(0.1, 0.3)), "
                f"got {len(raw)}"
            )
        form = parse_string_form(raw)
        if form is None:
            raise ValueError(
                f"{_shown(raw)} is not a spec: give a list of values, uniform(a, b), loguniform(a, b) or "
                "int(a, b)"
            )
        kind, low, high = form
        return _distribution(kind, [low, high])
    if isinstance(raw, dict) and len(raw) == 1:
        ((kind, arg),) = raw.items()
        if kind == "choice":
            return _values(arg)
        if kind in DISTRIBUTIONS:
            return _distribution(kind, arg)
    raise ValueError(
        'give a list of values, {"choice": [...]}, {"uniform": [a, b]}, {"loguniform": [a, b]} or '
        '{"int": [a, b]}'
    )


def parse_search_space(raw: Any, method: Method) -> SearchSpace:
    """The typed space; SearchSpaceError naming each bad field (``""``: the space as a whole)."""
    if not isinstance(raw, dict) or not raw:
        raise SearchSpaceError([("", "give a non-empty mapping of config paths (e.g. trainer.lr) to specs")])
    if len(raw) > MAX_FIELDS:
        raise SearchSpaceError([("", f"at most {MAX_FIELDS} fields")])
    errors: list[tuple[str, str]] = []
    fields: dict[str, Spec] = {}
    for path in sorted(raw):
        if not isinstance(path, str) or not PATH_RE.match(path):
            errors.append((str(path)[:100], "not a dotted config path (e.g. trainer.lr)"))
            continue
        try:
            spec = parse_spec(raw[path])
        except ValueError as exc:
            errors.append((path, str(exc)))
            continue
        if method == "grid" and isinstance(spec, Distribution):
            errors.append((path, f"a grid search takes a list of values, not a distribution ({spec.kind})"))
            continue
        fields[path] = spec
    prefixes = [(a, b) for a in fields for b in fields if b.startswith(a + ".")]
    errors += [(b, f"lies inside {a}, which the space also sets") for a, b in prefixes]
    if errors:
        raise SearchSpaceError(errors)
    return SearchSpace(fields)


def grid_points(space: SearchSpace) -> list[Point]:
    names = list(space.fields)
    lists = [space.fields[n].values for n in names]  # type: ignore[union-attr]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*lists)]


def random_points(space: SearchSpace, n: int, seed: int) -> list[Point]:
    rng = random.Random(seed)
    out: list[Point] = []
    for _ in range(n):
        point: Point = {}
        for name, spec in space.fields.items():
            point[name] = rng.choice(spec.values) if isinstance(spec, Values) else spec.sample(rng)
        out.append(point)
    return out


def points(space: SearchSpace, method: Method, *, n: int, seed: int) -> list[Point]:
    """The sweep's points: the whole grid (``n`` is checked by the caller), or ``n`` random ones."""
    return grid_points(space) if method == "grid" else random_points(space, n, seed)


def overrides(point: Point) -> dict[str, Any]:
    """``{"trainer.lr": 1e-6}`` -> ``{"trainer": {"lr": 1e-6}}`` (a nested partial config)."""
    out: dict[str, Any] = {}
    for path, value in point.items():
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out

"""A safe evaluator of arithmetic expressions (the ``calculator`` tool's): the text is parsed with
:mod:`ast` and only numbers, ``+ - * / // % **``, unary ``+ -`` and parentheses are evaluated; anything
else (a name, an attribute, a call, a subscript, a comparison, a string) is refused before anything runs.
Nothing is ever passed to ``eval``.

Bounds keep a policy's expression from costing time or memory: at most ``MAX_CHARS`` characters, an
exponent of at most ``MAX_EXPONENT`` in magnitude, and no integer result wider than ``MAX_BITS`` bits
(checked before a power is computed, and after every operation).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_CHARS = 200
MAX_EXPONENT = 100
MAX_BITS = 1024

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class ExpressionError(ValueError):
    """An expression that is not plain arithmetic, or whose value is out of bounds (one line)."""


def evaluate(expression: str) -> Number:
    """The value of ``expression`` (module docstring); :class:`ExpressionError` when it is refused."""
    if not isinstance(expression, str):
        raise ExpressionError("the expression must be a text")
    if len(expression) > MAX_CHARS:
        raise ExpressionError(f"the expression is longer than {MAX_CHARS} characters")
    if not expression.strip():
        raise ExpressionError("the expression is empty")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ExpressionError("not an arithmetic expression") from None
    return _value(tree.body)


def format_number(value: Number) -> str:
    """``value`` as the tool writes it: an integer in full, a float in at most 12 significant digits."""
    if isinstance(value, int):
        return str(value)
    return format(value, ".12g")


def _value(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ExpressionError("only numbers are allowed")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_value(node.operand)))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_value(node.left), _value(node.right))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ExpressionError("division by zero") from None
        except OverflowError:
            raise ExpressionError("the result is too large") from None
    raise ExpressionError(f"{type(node).__name__} is not allowed: only numbers, + - * / // % ** and ()")


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise ExpressionError(f"the exponent is larger than {MAX_EXPONENT}")
    wide = isinstance(base, int) and isinstance(exponent, int) and base.bit_length() * exponent > MAX_BITS
    if wide:  # refused before it is computed
        raise ExpressionError("the result is too large")
    try:
        result = base**exponent
    except ZeroDivisionError:
        raise ExpressionError("division by zero") from None
    except OverflowError:
        raise ExpressionError("the result is too large") from None
    if isinstance(result, complex):
        raise ExpressionError("the result is not a real number")
    return _checked(result)


def _checked(value: Number) -> Number:
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise ExpressionError("the result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise ExpressionError("the result is not finite")
    return value

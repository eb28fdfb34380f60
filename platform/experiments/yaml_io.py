"""YAML text from users, parsed without the parts that make a small document huge or deep.

A config needs neither anchors nor aliases, and PyYAML expands aliases into shared objects that every
later step (validation, JSON, the database) walks as copies: 448 bytes of nested aliases become
megabytes (the "billion laughs"). So anchors and aliases are refused at the first one, nesting is
bounded, and the document's size is checked before parsing: a refusal costs microseconds. What it
parses then passes the same check as every JSON body (``rl_engine.safe_json``): ``.inf``/``.nan``, NUL
(``"\\0"``), lone surrogates and non-JSON types (dates, ``!!binary``, sets) are a 400 naming the field.

What PyYAML itself raises besides its own errors is a 400 too, with the position: a control character
(the reader refuses it before parsing), a date that does not exist (``2024-02-30``), an integer literal
longer than ``MAX_INT_TEXT`` characters (Python refuses to read more than 4300 decimal digits, and a
hex or binary literal of thousands of digits reads into a number that no JSON answer can show).
"""

from __future__ import annotations

from typing import Any

import yaml
from django.conf import settings

from rl_engine.config import ConfigError, yaml_where
from rl_engine.safe_json import json_problem

MAX_YAML_DEPTH = 32
MAX_INT_TEXT = 100  # characters of an integer literal: a seed is at most 19 digits


class _Refused(yaml.YAMLError):
    def __init__(self, message: str, mark: yaml.Mark | None):
        self.message, self.mark = message, mark
        super().__init__(message)


class StrictSafeLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors (``&a``), aliases (``*a``) and nesting deeper than MAX_YAML_DEPTH."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(
                f"aliases (*{event.anchor}) are not allowed: write the value out", event.start_mark
            )
        if getattr(event, "anchor", None):
            raise _Refused(
                f"anchors (&{event.anchor}) are not allowed: write the value out", event.start_mark
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(
                    f"nesting deeper than {MAX_YAML_DEPTH} levels is not allowed", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """A value a constructor cannot build (``2024-02-30``) is refused where it stands."""
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:
            raise _Refused(f"{_shown(node.value)} cannot be read ({exc})", node.start_mark) from None

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if len(node.value) > MAX_INT_TEXT:
            raise _Refused(
                f"an integer of {len(node.value)} characters is not allowed (at most {MAX_INT_TEXT})",
                node.start_mark,
            )
        return super().construct_yaml_int(node)


StrictSafeLoader.add_constructor("tag:yaml.org,2002:int", StrictSafeLoader.construct_yaml_int)


def _shown(value: Any, limit: int = 40) -> str:
    text = str(value)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _unreadable_character(text: str, exc: yaml.reader.ReaderError) -> str:
    """Where the reader found a character YAML does not allow (a control character), as editors count."""
    position = exc.position
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    char = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
    return f"not valid YAML: the character {char} is not allowed (line {line}, column {column})"


def load_yaml_text(text: str) -> Any:
    """Parse one YAML document from a user. Raises ConfigError saying why it is refused."""
    limit = int(getattr(settings, "YAML_IMPORT_MAX_BYTES", 200_000))
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ConfigError([("", f"the YAML document is {size} bytes; the limit is {limit} bytes")])
    try:
        loader = StrictSafeLoader(text)  # the reader checks every character here
    except yaml.reader.ReaderError as exc:
        raise ConfigError([("", _unreadable_character(text, exc))]) from None
    try:
        data = loader.get_single_data()
    except _Refused as exc:
        raise ConfigError([("", f"{exc.message}{yaml_where(exc.mark)}")]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([("", f"not valid YAML{yaml_where(getattr(exc, 'problem_mark', None))}")]) from None
    finally:
        loader.dispose()
    problem = json_problem(data, max_depth=MAX_YAML_DEPTH)  # the JSON bodies' own check (rl_engine.safe_json)
    if problem:
        raise ConfigError([problem])
    return data

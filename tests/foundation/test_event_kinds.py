"""Event kinds travel typed: ``rl_engine.wire.EventKind`` is their one declaration, and no code in the
engine or the platform names a kind by a bare string (``log_event("alert", ...)``, ``kind="log"``,
``kind == "status"``): a typo there would be an event the platform refuses, found only at run time.

Checked on the source (every call and comparison), like the import boundary."""

from __future__ import annotations

import ast
from pathlib import Path

from rl_engine.wire import EventKind
from tests.conftest import REPO_ROOT

KINDS = frozenset(k.value for k in EventKind)
# What reports or stores an event, with the kind as its first argument.
REPORTERS = frozenset({"log_event", "_report", "event", "events_append", "NewEvent"})


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _str(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def bare_kinds(path: Path) -> list[str]:
    """``line N: ...`` for each event kind written as a string literal in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _name(node.func)
            if name in REPORTERS and node.args and (s := _str(node.args[0])) is not None:
                found.append((node.lineno, f"{name}({s!r}, ...)"))
            for kw in node.keywords:
                if kw.arg == "kind" and (s := _str(kw.value)) in KINDS:
                    found.append((node.lineno, f"{name}(kind={s!r})"))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_name(s).endswith("kind") for s in sides):
                for s in sides:
                    if (value := _str(s)) in KINDS:
                        found.append((node.lineno, f"compared with {value!r}"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def sources() -> list[Path]:
    files = [f for folder in ("rl_engine", "platform") for f in sorted((REPO_ROOT / folder).rglob("*.py"))]
    return [f for f in files if "migrations" not in f.parts]


def test_no_event_kind_is_a_bare_string():
    offenders = {str(f.relative_to(REPO_ROOT)): bad for f in sources() if (bad := bare_kinds(f))}
    assert offenders == {}


def test_the_checker_finds_bare_kinds(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "sink.log_event('alert', 'slow')\n"
        "self._report('status', m, {})\n"
        "events_append(run_id=1, kind='log', message='m')\n"
        "NewEvent(kind='checkpoint')\n"
        "wire.event('bogus', 'a typo is caught too')\n"
        "if kind == 'status': pass\n"
        "if 'alert' != event.kind: pass\n"
        # typed, or not an event kind at all: fine
        "sink.log_event(EventKind.ALERT, 'slow')\n"
        "ApiUse('vllm:SamplingParams', kind='class')\n"
        "if kind == EventKind.STATUS: pass\n"
    )
    assert bare_kinds(bad) == [
        "line 1: log_event('alert', ...)",
        "line 2: _report('status', ...)",
        "line 3: events_append(kind='log')",
        "line 4: NewEvent(kind='checkpoint')",
        "line 5: event('bogus', ...)",
        "line 6: compared with 'status'",
        "line 7: compared with 'alert'",
    ]

"""A package's ``__init__.py`` holds a docstring and re-exports, nothing else: code lives in named modules,
where a reader (and ``grep``) finds it by the module's name.

Allowed: the docstring, imports (also under ``if TYPE_CHECKING:``), ``__all__`` / ``__version__``, and a
lazy re-export (PEP 562): a module ``__getattr__`` and the constant table of where each name lives."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

FOLDERS = ("rl_engine", "platform", "client/rlp_client")
# Inits that still hold code, with the reason. Each must still need its exception (the test says so when
# it does not: remove it then).
KNOWN: dict[str, str] = {}


def _is_import_block(node: ast.stmt) -> bool:
    return isinstance(node, ast.Import | ast.ImportFrom)


def _is_constant(node: ast.expr | None) -> bool:
    try:
        ast.literal_eval(node)  # type: ignore[arg-type]
    except (ValueError, TypeError, SyntaxError):
        return False
    return True


def code_in_init(path: Path) -> list[str]:
    """``line N: <statement kind>`` for each statement beyond a docstring and re-exports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if _is_import_block(node):
            continue
        if (
            isinstance(node, ast.If)
            and ast.unparse(node.test) == "TYPE_CHECKING"
            and all(_is_import_block(n) for n in node.body)
            and not node.orelse
        ):
            continue
        if isinstance(node, ast.Assign | ast.AnnAssign) and _is_constant(node.value):
            continue  # __all__, __version__, a lazy re-export's table
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            continue  # a lazy re-export
        found.append(f"line {node.lineno}: {type(node).__name__}")
    return found


def inits() -> list[Path]:
    return sorted(f for folder in FOLDERS for f in (REPO_ROOT / folder).rglob("__init__.py"))


def test_package_inits_hold_a_docstring_and_re_exports_only():
    offenders = {
        rel: bad
        for f in inits()
        if (bad := code_in_init(f)) and (rel := str(f.relative_to(REPO_ROOT))) not in KNOWN
    }
    assert offenders == {}
    stale = [rel for rel in KNOWN if not code_in_init(REPO_ROOT / rel)]
    assert stale == [], "these inits hold no code any more: remove them from KNOWN"


def test_the_checker_finds_code_in_an_init(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text(
        '"""Doc."""\n'
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from a.b import C\n"
        "from a.b import D\n"
        "__all__ = ['C', 'D']\n"
        "__version__ = '1'\n"
        "_WHERE = {'C': 'b'}\n"
        "def __getattr__(name):\n    return name\n"
        "def build(cfg):\n    return cfg\n"
        "class Thing:\n    pass\n"
        "REGISTRY = {'x': build}\n"
        "if DEBUG:\n    import pdb\n"
    )
    assert code_in_init(init) == [
        "line 12: FunctionDef",
        "line 14: ClassDef",
        "line 16: Assign",
        "line 17: If",
    ]

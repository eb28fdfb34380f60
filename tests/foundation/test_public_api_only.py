"""Product code uses other packages through their public API only: a private attribute of another package is
a break waiting for its next minor release.

Checked on the source of the platform, the engine and the client (every module, also code inside
functions):

- no import of a private module or name of another package (``from x import _y``, ``import x._y``);
- no access to a private attribute (``obj._name``) that the product does not define itself: an
  underscore name no module of the product assigns, defines or declares belongs to another package
  (``cache._servers``, ``pool._threads``, ``layer._group_key`` were such cases);
- nothing of channels-redis at all (the live bus owns its Redis channels: tracking/bus.py), and none of
  asgiref's undocumented thread-locals (``SyncToAsync.threadlocal``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO_ROOT

PRODUCT = ("platform", "rl_engine", "client/rlp_client")
OWN_PACKAGES = {
    "rl_engine",
    "rlp_client",
    "config",
    "accounts",
    "experiments",
    "tracking",
    "alerts",
    "sweeps",
    "launcher",
    "core",
}
FORBIDDEN_MODULES = ("channels_redis",)
FORBIDDEN_ATTRIBUTES = {"threadlocal"}  # asgiref's SyncToAsync.threadlocal (main_event_loop …)
# Underscore names that are another package's documented API.
DOCUMENTED = {"_meta"}  # Django's Model _meta API (docs.djangoproject.com: ref/models/meta)
# The engine's GPU paths still reach three private names, each where no public API does the job; they
# belong with the backends' seam (docs/architecture.md, "Known debts"), and no new one may join them.
KNOWN_DEBTS = {
    # an NCCL group's timeout: torch's NCCL constructor takes only Options, whose timeout torch itself
    # sets as ``_timeout`` (distributed_c10d.py); a Gloo group is built with the public constructor
    ("rl_engine/weights/broadcast.py", "_timeout"),
    # SGLang's tensor serialisation for update_weights_from_tensor, called per bucket
    ("rl_engine/backends/sglang/weights.py", "_serialize_tensors_per_rank"),
}


def product_files() -> list[Path]:
    files: list[Path] = []
    for folder in PRODUCT:
        files += [p for p in sorted((REPO_ROOT / folder).rglob("*.py")) if "migrations" not in p.parts]
    return files


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own(module: str | None, level: int) -> bool:
    return level > 0 or (module or "").split(".")[0] in OWN_PACKAGES


def defined_names(trees: list[ast.Module]) -> set[str]:
    """Every underscore name the product defines: functions, classes, assigned names and attributes of
    ``self`` / ``cls``,
    arguments, dataclass fields and keywords of calls (``Span(_x=…)`` would define one too)."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store | ast.Del)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):  # an attribute of its own object (``opts._timeout = …`` writes another package's)
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
    return {n for n in names if _private(n)}


def violations(where: str, tree: ast.Module, own: set[str]) -> Iterator[str]:
    """What ``tree`` (the module at ``where``) reads of other packages' private parts, given the
    underscore names the product defines itself (``own``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if _own(node.module, node.level):
                continue
            module = node.module or ""
            if any(_private(part) for part in module.split(".")):
                yield f"{where}:{node.lineno}: imports the private module {module}"
            for alias in node.names:
                if _private(alias.name):
                    yield f"{where}:{node.lineno}: imports the private name {module}.{alias.name}"
            if module.split(".")[0] in FORBIDDEN_MODULES:
                yield f"{where}:{node.lineno}: imports {module}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _own(alias.name, 0):
                    continue
                if any(_private(part) for part in alias.name.split(".")):
                    yield f"{where}:{node.lineno}: imports the private module {alias.name}"
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    yield f"{where}:{node.lineno}: imports {alias.name}"
        elif isinstance(node, ast.Attribute):
            if (
                _private(node.attr)
                and node.attr not in own | DOCUMENTED
                and (where, node.attr) not in KNOWN_DEBTS
            ):
                yield f"{where}:{node.lineno}: reads {node.attr}, a private attribute of another package"
            if node.attr in FORBIDDEN_ATTRIBUTES:
                yield f"{where}:{node.lineno}: reads {node.attr}, an undocumented attribute of asgiref"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            name = node.args[1].value
            if isinstance(name, str) and (
                (_private(name) and name not in own and (where, name) not in KNOWN_DEBTS)
                or name in FORBIDDEN_ATTRIBUTES
            ):
                yield f"{where}:{node.lineno}: getattr of {name}, a private attribute of another package"


def test_the_product_uses_other_packages_through_their_public_api_only():
    files = product_files()
    trees = [ast.parse(p.read_text(), filename=str(p)) for p in files]
    own = defined_names(trees)
    found = [
        v
        for path, tree in zip(files, trees, strict=True)
        for v in violations(str(path.relative_to(REPO_ROOT)), tree, own)
    ]
    assert not found, "\n".join(found)


def test_the_check_finds_what_it_is_for():
    """Each rule, on code of the kind it was written for (the product's own history); the product's own
    underscore names pass."""
    samples = {
        "from channels_redis.core import RedisChannelLayer\n": "imports channels_redis.core",
        "import channels_redis.core\n": "imports channels_redis.core",
        "from asgiref.sync import SyncToAsync\nloop = SyncToAsync.threadlocal.main_event_loop\n": "threadlocal",
        "loop = getattr(SyncToAsync.threadlocal, 'main_event_loop', None)\n": "threadlocal",
        "def f(cache):\n    return cache._servers[0]\n": "reads _servers",
        "def f(pool):\n    return len(pool._threads)\n": "reads _threads",
        "def f(layer):\n    return getattr(layer, '_group_key')\n": "getattr of _group_key",
        "from concurrent.futures import _base\n": "private name concurrent.futures._base",
        "from torch.distributed._tensor import DTensor\n": "private module torch.distributed._tensor",
        "import torch._dynamo\n": "private module torch._dynamo",
    }
    for code, expected in samples.items():
        tree = ast.parse(code)
        found = list(violations("sample.py", tree, defined_names([tree])))
        assert any(expected in v for v in found), (code, found)
    own = "class A:\n    def __init__(self):\n        self._x = 1\n\n    def f(self, other):\n        return other._x\n"
    tree = ast.parse(own)
    assert not list(violations("own.py", tree, defined_names([tree])))

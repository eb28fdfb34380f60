"""The seam between engine and platform stays narrow, and the platform's apps depend on each other one way.

Checked on the source (every import statement, also those inside functions), in both directions, and
by importing the engine's public modules in a fresh interpreter (what they load transitively)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO_ROOT

# The platform's Django apps (and its project package, ``config``), lowest first: an app may import from
# the apps before it, never from those after it. Any app may import another app's ``models`` module: the
# models already refer to each other across apps by name (a project's runs, a run's project, a run's
# checkpoints), the model layer is one schema. So experiments never imports launcher (the launcher owns
# enqueueing its tasks: experiments.lifecycle announces, launcher.lifecycle enqueues), nor tracking's
# services (tracking records the status events it announces).
APP_ORDER = ("accounts", "experiments", "tracking", "alerts", "sweeps", "launcher", "core", "config")
PLATFORM_APPS = set(APP_ORDER)
SHARED_MODULE = "models"
# What the platform may import of the engine: the config schema (the package ``rl_engine.config``, by
# what its ``__init__`` re-exports) and presets, the model catalogue (what a model directory holds), the
# launch spec, the ingestion wire format, the walk of local data paths, what a dataset folder's card or
# manifest reads, the strict URL grammar, the check of free-form JSON values and the bounded reading of
# files the platform did not write (which the catalogue and the dataset folders use). Each imports
# neither torch nor ray nor transformers (checked below).
ENGINE_PUBLIC = (
    "rl_engine.config",
    "rl_engine.presets",
    "rl_engine.catalogue",
    "rl_engine.jobspec",
    "rl_engine.wire",
    "rl_engine.paths",
    "rl_engine.dataset_folder",
    "rl_engine.strict_url",
    "rl_engine.safe_json",
    "rl_engine.safe_files",
)
HEAVY = ("torch", "ray", "transformers")


@dataclass(frozen=True)
class Import:
    module: str  # what ``import x.y`` or ``from x.y import ...`` names
    names: tuple[str, ...]  # what a ``from`` import takes from it (empty for ``import x.y``)
    line: int

    def targets(self) -> list[str]:
        """The dotted names this statement reaches: ``from a import b`` reaches ``a.b`` (a module or a
        name in ``a``)."""
        return [f"{self.module}.{n}" for n in self.names] if self.names else [self.module]


def imports_of(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Import(alias.name, (), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(Import(node.module, tuple(a.name for a in node.names), node.lineno))
    return out


def imported_top_modules(path: Path) -> set[str]:
    return {imp.module.split(".")[0] for imp in imports_of(path)}


def python_files(folder: str) -> list[Path]:
    files = sorted((REPO_ROOT / folder).rglob("*.py"))
    assert files, f"no python files under {folder}/"
    return files


def platform_sources() -> list[tuple[str, Path]]:
    """(app, file) of the platform's code; migrations only refer to other apps by name."""
    return [(f.relative_to(REPO_ROOT / "platform").parts[0], f)
            for f in python_files("platform") if "migrations" not in f.parts]  # fmt: skip


def engine_reach_violations(path: Path) -> list[str]:
    """Imports of engine modules other than its public ones (``from rl_engine import trainer`` too)."""
    bad = []
    for imp in imports_of(path):
        if imp.module.split(".")[0] != "rl_engine":
            continue
        if imp.module in ENGINE_PUBLIC:  # ``from rl_engine.config import X`` or ``import rl_engine.wire``
            continue
        if imp.module == "rl_engine" and imp.names and all(t in ENGINE_PUBLIC for t in imp.targets()):
            continue
        bad.append(
            f"line {imp.line}: {imp.module}" + (f" import {', '.join(imp.names)}" if imp.names else "")
        )
    return bad


def app_order_violations(app: str, path: Path) -> list[str]:
    """Imports from an app later in APP_ORDER (other than its models), and of another app's private
    modules or names (``_x``)."""
    bad = []
    for imp in imports_of(path):
        parts = imp.module.split(".")
        other = parts[0]
        if other not in PLATFORM_APPS or other == app:
            continue
        where = f"line {imp.line}: {imp.module}"
        private = [t for t in imp.targets() if any(p.startswith("_") for p in t.split(".")[1:])]
        if private:
            bad.append(f"{where}: private {', '.join(private)}")
        later = APP_ORDER.index(other) > APP_ORDER.index(app)
        shared = all(t.split(".")[1:2] == [SHARED_MODULE] for t in imp.targets())
        if later and not shared:
            bad.append(f"{where}: {app} may not import {other} (it comes later in {APP_ORDER})")
    return bad


def test_engine_imports_nothing_from_django_or_the_platform():
    offenders = {
        str(f.relative_to(REPO_ROOT)): sorted(bad)
        for f in python_files("rl_engine")
        if (
            bad := imported_top_modules(f)
            & (PLATFORM_APPS | {"django", "rest_framework", "channels", "celery"})
        )
    }
    assert offenders == {}


def test_platform_never_imports_torch_and_only_the_launcher_imports_ray():
    torch_users, ray_users = {}, {}
    for f in python_files("platform"):
        mods = imported_top_modules(f)
        rel = f.relative_to(REPO_ROOT)
        if mods & {"torch", "transformers", "vllm", "sglang"}:
            torch_users[str(rel)] = sorted(mods & {"torch", "transformers", "vllm", "sglang"})
        if "ray" in mods and rel.parts[1] != "launcher":
            ray_users[str(rel)] = ["ray"]
    assert torch_users == {}
    assert ray_users == {}


def test_platform_reaches_the_engine_only_through_its_public_interfaces():
    offenders = {
        str(f.relative_to(REPO_ROOT)): bad
        for f in python_files("platform")
        if (bad := engine_reach_violations(f))
    }
    assert offenders == {}


def test_the_engines_public_modules_load_no_torch_ray_or_transformers():
    # In a fresh interpreter: what they import, and what that imports, transitively.
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(ENGINE_PUBLIC)!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


def test_platform_apps_depend_on_each_other_one_way_and_only_on_public_modules():
    offenders = {
        str(f.relative_to(REPO_ROOT)): bad
        for app, f in platform_sources()
        if (bad := app_order_violations(app, f))
    }
    assert offenders == {}
    experiments_imports = {
        imp.module for _, f in platform_sources() if _ == "experiments" for imp in imports_of(f)
    }
    assert not {m for m in experiments_imports if m.split(".")[0] == "launcher"}


# The client package (client/rlp_client) is installed by users who have none of the platform's or the
# engine's dependencies: it speaks HTTP and websockets only.
CLIENT_DEPENDENCIES = {"httpx", "websockets", "rich", "yaml"}
CLIENT_FORBIDDEN = PLATFORM_APPS | {"rl_engine", "django", "rest_framework", "channels", "celery", *HEAVY}


def test_the_client_imports_neither_the_platform_nor_django_torch_or_ray():
    stdlib = set(sys.stdlib_module_names)
    offenders = {}
    for f in python_files("client/rlp_client"):
        mods = imported_top_modules(f) - {"rlp_client", "__future__"}
        if bad := (mods & CLIENT_FORBIDDEN) | (mods - stdlib - CLIENT_DEPENDENCIES):
            offenders[str(f.relative_to(REPO_ROOT))] = sorted(bad)
    assert offenders == {}
    # What importing it (and its CLI) loads, transitively, in a fresh interpreter.
    code = (
        "import json, sys\nimport rlp_client, rlp_client.cli\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(CLIENT_FORBIDDEN)!r}))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT / "client", capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert json.loads(out.stdout) == []


def test_the_checkers_detect_what_they_forbid(tmp_path):
    # The checks above must be able to fail: feed them files that break each rule.
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfrom django.db import models\nfrom experiments.models import Run\n")
    assert imported_top_modules(bad) == {"torch", "django", "experiments"}

    engine = tmp_path / "engine.py"
    engine.write_text(
        "from rl_engine import trainer\nfrom rl_engine import wire, presets\nimport rl_engine.pipeline.driver\n"
        "from rl_engine.config import parse_config\nfrom rl_engine.sinks import http\n"
    )
    assert engine_reach_violations(engine) == [
        "line 1: rl_engine import trainer",
        "line 3: rl_engine.pipeline.driver",
        "line 5: rl_engine.sinks import http",
    ]

    lifecycle = tmp_path / "services.py"
    lifecycle.write_text(
        "def launch():\n    from launcher.tasks import start_run\n"  # hidden in a function: still found
        "from tracking.models import Checkpoint\nfrom accounts.services import token_create\n"
        "from tracking import services\nfrom accounts.services import _new_secret\n"
    )
    assert app_order_violations("experiments", lifecycle) == [
        "line 5: tracking: experiments may not import tracking (it comes later in "
        "('accounts', 'experiments', 'tracking', 'alerts', 'sweeps', 'launcher', 'core', 'config'))",
        "line 6: accounts.services: private accounts.services._new_secret",
        "line 2: launcher.tasks: experiments may not import launcher (it comes later in "
        "('accounts', 'experiments', 'tracking', 'alerts', 'sweeps', 'launcher', 'core', 'config'))",
    ]


# --- import circles -----------------------------------------------------------------------------------


def module_graph(root: Path, *packages: str) -> dict[str, set[str]]:
    """Each module of ``packages`` (folders under ``root``) -> the modules of those packages it imports:
    every import statement, also inside functions and under ``if TYPE_CHECKING:``, relative ones
    resolved. ``from a import b`` reaches the module ``a.b`` when there is one, else ``a``; a package is
    its ``__init__.py``."""
    files = {}
    for f in sorted(f for package in packages for f in (root / package).rglob("*.py")):
        parts = f.relative_to(root).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f

    def owner(target: str) -> str:  # the longest prefix of a dotted name that is a module here
        while target and target not in files:
            target = target.rpartition(".")[0]
        return target

    graph = {}
    for name, path in files.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = []
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*here[: len(here) - node.level + 1], *([base] if base else [])])
                targets += [f"{base}.{alias.name}" for alias in node.names]
        graph[name] = {t for t in map(owner, targets) if t and t != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle ``[a, b, ..., a]`` per group of modules that reach each other (a strongly connected
    component of more than one module, Tarjan's algorithm), the shortest from its first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = {stack.pop()}
            while v not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    circles = []
    for group in groups:
        start = min(group)
        paths: dict[str, list[str]] = {}
        queue = deque([[start]])
        while start not in paths:  # breadth first: the shortest way back to ``start``
            path = queue.popleft()
            for w in sorted(graph[path[-1]] & group):
                if w not in paths:
                    paths[w] = [*path, w]
                    queue.append(paths[w])
        circles.append(paths[start])
    return sorted(circles)


# Circles another change removes; each must still exist (delete its line once it is gone).
PENDING_CIRCLES: list[list[str]] = []


def test_the_engine_has_no_import_circle():
    graph = module_graph(REPO_ROOT, "rl_engine")
    # the graph is the real one: a function-level import is an edge (components builds the worker lazily)
    assert "rl_engine.backends" in graph["rl_engine.pipeline.components"]
    circles = import_circles(graph)
    new = [c for c in circles if c not in PENDING_CIRCLES]
    assert not new, "import circles in rl_engine/:\n" + "\n".join(" -> ".join(c) for c in new)
    gone = [c for c in PENDING_CIRCLES if c not in circles]
    assert not gone, f"no longer a circle, delete it from PENDING_CIRCLES: {gone}"


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with every module folded into its package one level below the root
    (``rl_engine.rollout.base`` -> ``rl_engine.rollout``; a top-level module stays itself); imports
    inside one package are dropped."""

    def fold(module: str) -> str:
        return ".".join(module.split(".")[:2])

    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(fold(module), set()).update(fold(t) for t in targets if fold(t) != fold(module))
    return out


# What the engine's shared rollout and weight packages may not import: both stand below the backends
# (rl_engine.backends: each engine's worker and its weight halves, the registry), and beside each other.
NEVER_IMPORTS = {  # the worker contract (rollout) may name the bucket types (weights); nothing points back
    "rl_engine.rollout": {"rl_engine.backends"},
    "rl_engine.weights": {"rl_engine.backends", "rl_engine.rollout"},
}


def test_the_engines_packages_have_no_import_circle_and_the_backends_sit_on_rollout_and_weights():
    modules = module_graph(REPO_ROOT, "rl_engine")
    packages = package_graph(modules)
    assert {"rl_engine.rollout", "rl_engine.weights"} <= packages["rl_engine.backends"]
    circles = import_circles(packages)
    assert not circles, "import circles between rl_engine's packages:\n" + "\n".join(
        " -> ".join(c) for c in circles
    )
    offenders = {  # type-only imports (under ``if TYPE_CHECKING:``) count too
        module: sorted(t for t in targets if ".".join(t.split(".")[:2]) in NEVER_IMPORTS[package])
        for module, targets in modules.items()
        if (package := ".".join(module.split(".")[:2])) in NEVER_IMPORTS
    }
    assert {m: t for m, t in offenders.items() if t} == {}


def test_the_package_circle_check_finds_a_circle_no_module_circle_shows(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("from pkg.high import f\n")  # the lower package reaches up
    (pkg / "low" / "b.py").write_text("B = 1\n")
    (pkg / "high.py").write_text("from pkg.low.b import B\n\ndef f():\n    return B\n")
    modules = module_graph(tmp_path, "pkg")
    assert import_circles(modules) == []  # pkg.low.a -> pkg.high -> pkg.low.b: no module circle
    assert package_graph(modules) == {"pkg": set(), "pkg.low": {"pkg.high"}, "pkg.high": {"pkg.low"}}
    assert import_circles(package_graph(modules)) == [["pkg.high", "pkg.low", "pkg.high"]]


def test_the_circle_check_finds_a_planted_circle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .c import C\n")
    (pkg / "a.py").write_text("import os\n\ndef f():\n    from pkg import b\n")  # hidden in a function
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.c import C\n"
    )
    (pkg / "sub" / "c.py").write_text("from ..a import f\nfrom pkg.d import D\n")
    (pkg / "d.py").write_text("import pkg.sub\n")
    graph = module_graph(tmp_path, "pkg")
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.d": {"pkg.sub"},
        "pkg.sub": {"pkg.sub.c"},
        "pkg.sub.c": {"pkg.a", "pkg.d"},
    }
    # two circles through pkg.sub.c: one group, reported by its shortest circle from its first module
    assert import_circles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    (pkg / "a.py").write_text("import os\n")
    assert import_circles(module_graph(tmp_path, "pkg")) == [["pkg.d", "pkg.sub", "pkg.sub.c", "pkg.d"]]
    (pkg / "d.py").write_text("D = 1\n")
    assert import_circles(module_graph(tmp_path, "pkg")) == []


# --- the platform never writes a config field; no import circle in the platform -------------------------
# (the user's config is read, typed, and stored as it came: where a run runs is the launcher's placement)

CONFIG_NAME = re.compile(r"^(config|cfg)$|_(config|cfg)$")  # a name (or parameter) holding a config
CONFIG_SECTIONS = {"model", "data", "trainer", "rollout", "algorithm", "pipeline", "logging", "mlflow", "wandb",
                   "eval", "resources", "reward"}  # fmt: skip
CONFIG_CALL = re.compile(r"(^|_)(config|preset)s?$")  # a call that hands out a config (get_preset, ...)
DICT_WRITES = {"setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__"}


class _ConfigWrites(ast.NodeVisitor):
    """Writes by string key into a config dict: ``x["k"] = v``, ``del x["k"]``, ``x["k"] += v``,
    ``x.setdefault("k", ...)``, ``x.update(...)``, ``x.pop("k")``, where ``x`` is a config or a section of
    one. A config is what a ``.config`` attribute, a config-named variable or parameter (``config``,
    ``cfg``, ``*_config``, ``*_cfg``), a section-named parameter (``model``, ``data``, ...), a call named
    like a config (``*_config``, ``*_preset``) or a copy / this module's own function of one holds, and
    ``.get``, ``[...]``, ``or`` and ``{**...}`` of one."""

    def __init__(self, local_functions: frozenset[str]):
        self.found: list[str] = []
        self.scopes: list[set[str]] = [set()]
        self.local = local_functions

    def holds_config(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.scopes[-1]
        if isinstance(node, ast.Attribute):
            return node.attr == "config"
        if isinstance(node, ast.Subscript):
            return self.holds_config(node.value)
        if isinstance(node, ast.BoolOp):
            return any(self.holds_config(v) for v in node.values)
        if isinstance(node, ast.Dict):
            return any(
                k is None and self.holds_config(v) for k, v in zip(node.keys, node.values, strict=True)
            )
        if isinstance(node, ast.Call):
            func = node.func
            section = isinstance(func, ast.Attribute) and func.attr in ("get", "copy", "setdefault")
            if section and self.holds_config(func.value):
                return True
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("deepcopy", "copy", "dict") or name in self.local:
                return bool(node.args) and self.holds_config(node.args[0])
            return bool(CONFIG_CALL.search(name))
        return False

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        self.scopes.append({a.arg for a in args if CONFIG_NAME.search(a.arg) or a.arg in CONFIG_SECTIONS})
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _written(self, target: ast.AST, node: ast.stmt) -> None:
        if isinstance(target, ast.Subscript) and self.holds_config(target.value):
            self.found.append(f"line {node.lineno}: {ast.unparse(target)}")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._written(target, node)
            if isinstance(target, ast.Name) and (
                self.holds_config(node.value) or CONFIG_NAME.search(target.id)
            ):
                self.scopes[-1].add(target.id)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._written(node.target, node)
        if isinstance(node.target, ast.Name) and node.value is not None and self.holds_config(node.value):
            self.scopes[-1].add(node.target.id)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._written(node.target, node)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._written(target, node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in DICT_WRITES and self.holds_config(func.value):
            self.found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
        self.generic_visit(node)


def config_writes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    local = frozenset(n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    visitor = _ConfigWrites(local)
    visitor.visit(tree)
    return visitor.found


def test_the_platform_never_writes_a_config_field_by_string_path():
    offenders = {
        str(f.relative_to(REPO_ROOT)): bad for f in python_files("platform") if (bad := config_writes(f))
    }
    assert offenders == {}


def test_the_config_write_check_finds_what_it_forbids(tmp_path):
    bad = tmp_path / "policy.py"
    bad.write_text(
        "import copy\n"
        "def clear(config):\n    out = copy.deepcopy(config)\n    out.setdefault('trainer', {})['x'] = None\n"
        "    return out\n"
        "def launch(config, folder):\n    out = clear(config)\n    model = out.get('model') or {}\n"
        "    model['path'] = folder\n    out['trainer'].update(checkpoint_dir=folder)\n"
        "def resume(run):\n    config = clear(run.config)\n    config['trainer']['resume_from'] = 'x'\n"
        "def place(data, logging_cfg):\n    del data['cache_dir']\n    logging_cfg['jsonl_path'] += 'x'\n"
        "def preset():\n    p = get_preset('demo')\n    p.pop('name')\n"
    )
    assert config_writes(bad) == [
        "line 4: out.setdefault('trainer', {})['x']",
        "line 4: out.setdefault('trainer', {})",
        "line 9: model['path']",
        "line 10: out['trainer'].update(checkpoint_dir=folder)",
        "line 13: config['trainer']['resume_from']",
        "line 15: data['cache_dir']",
        "line 16: logging_cfg['jsonl_path']",
        "line 19: p.pop('name')",
    ]
    fine = tmp_path / "fine.py"
    fine.write_text(
        "def view(exp, fields):\n    start = {'config': exp.config}\n    start['project'] = 1\n"
        "    fields['config'] = stored(fields['config'])\n    resp = HttpResponse(config_to_yaml(exp.config))\n"
        "    resp['Content-Disposition'] = 'x'\n    cfg = parse_config(exp.config)\n"
        "    return cfg.model_copy(update={'seed': 1})\n"
    )
    assert config_writes(fine) == []


def test_no_import_circle_in_the_platform():
    graph = module_graph(REPO_ROOT / "platform", *APP_ORDER)
    assert "launcher.placement" in graph["launcher.services"]  # the real graph, across the apps
    circles = import_circles(graph)
    assert not circles, "import circles in platform/:\n" + "\n".join(" -> ".join(c) for c in circles)

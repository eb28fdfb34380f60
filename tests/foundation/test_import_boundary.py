"""The seam between engine and platform stays narrow: checked on the source, in both directions."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

PLATFORM_APPS = {"config", "core", "accounts", "experiments", "tracking", "launcher"}


def imported_top_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def python_files(folder: str) -> list[Path]:
    files = sorted((REPO_ROOT / folder).rglob("*.py"))
    assert files, f"no python files under {folder}/"
    return files


def test_engine_imports_nothing_from_django_or_the_platform():
    offenders = {
        str(f.relative_to(REPO_ROOT)): sorted(bad)
        for f in python_files("rl_engine")
        if (bad := imported_top_modules(f) & (PLATFORM_APPS | {"django", "rest_framework", "channels", "celery"}))
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
    allowed = {"rl_engine", "rl_engine.config", "rl_engine.presets"}
    offenders = {}
    for f in python_files("platform"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            bad = [m for m in mods if m.startswith("rl_engine") and m not in allowed]
            if bad:
                offenders[str(f.relative_to(REPO_ROOT))] = bad
    assert offenders == {}


def test_boundary_checker_detects_a_forbidden_import(tmp_path):
    # The checks above must be able to fail: feed the parser a file that breaks the rule.
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfrom django.db import models\nfrom experiments.models import Run\n")
    assert imported_top_modules(bad) == {"torch", "django", "experiments"}

"""The compatibility for fields that moved out of the config into the placement
(``rl_engine.config.moved``) has a removal release: this test fails once the project's version reaches
it, saying what to delete."""

from __future__ import annotations

import re
import tomllib

import rl_engine
from rl_engine.config.moved import REMOVED_IN
from tests.conftest import REPO_ROOT


def release(version: str) -> tuple[int, int, int]:
    """``0.1.0`` (or ``0.1.0rc1``, ``0.1.0.dev3``) -> (0, 1, 0)."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    assert match, f"not a release number: {version!r}"
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch)


def project_version() -> str:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


def due(version: str) -> bool:
    return release(version) >= release(REMOVED_IN)


def test_the_engine_says_the_projects_version():
    assert rl_engine.__version__ == project_version()  # a release bumps both


def test_the_moved_field_compatibility_is_gone_by_its_release():
    version = project_version()
    assert not due(version), (
        f"version {version} has reached {REMOVED_IN}, the release that drops the moved-field compatibility: "
        "delete rl_engine/config/moved.py and its uses (rl_engine.cli.load_job's lifting, "
        "ExperimentConfig._drop_unset_moved, the message in rl_engine.config.validation, docs/engine.md "
        "'Configs from before the split', their tests); experiments migration 0003 keeps its own copy"
    )


def test_the_check_fires_at_and_after_the_release():
    assert not due("0.1.9")
    assert due(REMOVED_IN) and due(f"{REMOVED_IN}rc1") and due("1.0.0")

"""The client (client/) is its own installable package: installed from its folder into a fresh virtual
environment that holds nothing but its own requirements (fetched from the package index), it imports,
its console script runs, and its type marker ships. No Django, torch or Ray can be imported there, so
any import of them by the client would fail here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

CLIENT = REPO_ROOT / "client"


def requirement_lines(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_requirements_file_lists_exactly_the_package_dependencies():
    meta = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert requirement_lines(CLIENT / "requirements.txt") == meta["dependencies"]
    assert meta["scripts"] == {"rlp": "rlp_client.cli:main"}
    assert (CLIENT / "rlp_client" / "py.typed").is_file()


@pytest.mark.slow
def test_installed_into_a_fresh_environment_it_imports_and_its_cli_runs(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py, pip = (
        venv / "bin" / "python",
        [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"],
    )
    subprocess.run(
        [*pip, "install", "--quiet", "-r", str(CLIENT / "requirements.txt")], check=True, timeout=600
    )
    source = tmp_path / "client"  # a copy: building in place would leave build/ in the repository
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([*pip, "install", "--quiet", "--no-deps", str(source)], check=True, timeout=600)
    installed = {
        d["name"].lower()
        for d in json.loads(
            subprocess.run(
                [*pip, "list", "--format", "json"], check=True, capture_output=True, text=True
            ).stdout
        )
    }
    assert not installed & {"django", "torch", "ray", "channels", "celery", "djangorestframework"}

    code = (
        "import json, sys, pathlib, rlp_client, rlp_client.cli\n"
        "from rlp_client import Client, Run, MetricPoint, BadRequest\n"
        "print(json.dumps({'file': rlp_client.__file__,"
        " 'typed': (pathlib.Path(rlp_client.__file__).parent / 'py.typed').is_file()}))"
    )
    out = subprocess.run([str(py), "-c", code], cwd=tmp_path, check=True, capture_output=True, text=True)
    facts = json.loads(out.stdout)
    assert facts["typed"] and str(venv) in facts["file"]  # the installed copy, not the repository's
    help_text = subprocess.run([str(venv / "bin" / "rlp"), "--help"], cwd=tmp_path, check=True,
                               capture_output=True, text=True).stdout  # fmt: skip
    assert "login" in help_text and "experiment" in help_text
    bad = subprocess.run([str(py), "-m", "rlp_client", "run", "wait", "x"], cwd=tmp_path, capture_output=True,
                         text=True)  # fmt: skip
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == "error: run: expected an id (a positive integer), got 'x'"
    )

"""The images' build settings: the official images stay the defaults (compose and the Dockerfile agree),
no CA bundle or secret reaches a layer or the build context, and the compose smoke's preflight (what the
CI uses to decide whether to run it) says in one line why it cannot run."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml

from tests.conftest import REPO_ROOT

DOCKER = REPO_ROOT / "docker"
OFFICIAL = {
    "PYTHON_IMAGE": "python:3.11-slim-bookworm",
    "POSTGRES_IMAGE": "postgres:16",
    "REDIS_IMAGE": "redis:7",
}


def arg_defaults(dockerfile: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S*)$", dockerfile.read_text(), re.MULTILINE))


def compose_defaults() -> dict[str, str]:
    """Each ``${VAR:-default}`` / ``${VAR-default}`` of compose.yaml."""
    return dict(re.findall(r"\$\{(\w+):?-([^}]*)\}", (DOCKER / "compose.yaml").read_text()))


def test_the_official_images_are_the_defaults_and_compose_agrees_with_the_dockerfile():
    args = arg_defaults(DOCKER / "Dockerfile")
    defaults = compose_defaults()
    assert args["PYTHON_IMAGE"] == OFFICIAL["PYTHON_IMAGE"]
    for var in ("PYTHON_IMAGE", "WHEELS_IMAGE", "TORCH_INDEX_URL"):  # a build through compose = docker build
        assert defaults[var] == args[var], var
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    assert services["postgres"]["image"] == "${POSTGRES_IMAGE:-postgres:16}"
    assert services["redis"]["image"] == "${REDIS_IMAGE:-redis:7}"
    assert (
        defaults["POSTGRES_IMAGE"] == OFFICIAL["POSTGRES_IMAGE"]
        and defaults["REDIS_IMAGE"] == OFFICIAL["REDIS_IMAGE"]
    )
    assert arg_defaults(DOCKER / "Dockerfile.gpu")["PLATFORM_IMAGE"] == services["web"]["image"]


def test_no_ca_bundle_or_secret_reaches_a_layer_or_the_build_context():
    for name in ("Dockerfile", "Dockerfile.gpu"):
        text = (DOCKER / name).read_text()
        instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
        for line in instructions:  # a CA or pip config only as a BuildKit secret, never ARG/ENV/COPY
            if line.split()[0] in ("ARG", "ENV", "COPY", "ADD"):
                assert not re.search(r"cert|\.pem|\.crt|pip\.conf|PIP_CONFIG", line, re.IGNORECASE), (
                    name,
                    line,
                )
        assert "--mount=type=secret,id=ca" in text and "--mount=type=secret,id=pip_conf" in text, name
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert "**/.env" in ignored and "docker/local.env" in ignored  # COPY . . never takes docker/.env


def preflight(tmp_path: Path, docker: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"DOCKER": docker, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(REPO_ROOT / "scripts/compose_smoke.sh"), "--preflight"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_smoke_preflight_says_why_it_cannot_run_in_one_line(tmp_path):
    out = preflight(tmp_path, str(tmp_path / "no-such-docker"))
    assert (out.returncode, out.stdout) == (3, "no docker client\n"), out.stderr
    # A client whose daemon does not answer (as `docker info` fails without dockerd).
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    out = preflight(tmp_path, str(fake))
    assert out.returncode == 3 and out.stdout.count("\n") == 1, out
    assert out.stdout.startswith("no Docker daemon answers"), out.stdout

"""The form's ``env.name`` (``GET /api/schema/experiment``): the built-in environments, and the
environment plugins installed both in the engine's environment (``python -m rl_engine envs --json``) and
here (where configs are checked), found by their metadata without importing them; a bad environment
setting posted to the API is a 400 naming its field.

The plugin here is a package's metadata written to a folder on ``sys.path`` (as in
tests/engine/test_env_plugins.py); the engine's environment, another interpreter, is a stand-in script
set as ``ENGINE_PYTHON`` that answers its list of environments.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from experiments import engine_catalogue
from experiments.models import Experiment
from rl_engine.config.env import ENV_NAMES
from rl_engine.envs.plugins import refresh_plugins
from tests.engine.test_env_plugins import write_dist
from tests.factories import demo_config
from tests.platform.conftest import client_for

MODULE = "rlp_env_form_fixture"  # never written: discovery must not import it
PLUGIN = "nudge_form"


@pytest.fixture(autouse=True)
def fresh_catalogue():
    engine_catalogue.cache_clear()
    yield
    engine_catalogue.cache_clear()


@pytest.fixture
def member(team):
    return client_for(team["member"])


@pytest.fixture
def plugin_here(tmp_path, monkeypatch):
    write_dist(tmp_path / "site", "rlp-env-form", {PLUGIN: f"{MODULE}:factory"})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    refresh_plugins()
    yield
    monkeypatch.undo()
    refresh_plugins()


def engine_with(tmp_path: Path, plugins: list[str]) -> str:
    """A stand-in for the engine's interpreter answering ``-m rl_engine envs --json``."""
    envs = [{"name": n, "origin": "builtin", "description": ""} for n in ENV_NAMES] + [
        {"name": n, "origin": "plugin", "package": "rlp-env-form", "version": "1.2.3"} for n in plugins
    ]
    script = tmp_path / f"engine-python-{len(plugins)}"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps({'envs': envs, 'refused': []})}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def env_name_field(member, team) -> dict:
    schema = member.get(f"/api/schema/experiment?project={team['project'].pk}").json()
    return schema["$defs"]["EnvConfig"]["properties"]["name"]


def test_the_form_offers_the_built_in_environments(team, member):
    field = env_name_field(member, team)
    assert field["enum"] == [None, *ENV_NAMES] and "textarena" in field["enum"]


def test_the_form_offers_a_plugin_installed_in_the_engine_and_here(
    team, member, settings, tmp_path, plugin_here
):
    settings.ENGINE_PYTHON = engine_with(tmp_path, [PLUGIN])
    field = env_name_field(member, team)
    assert field["enum"] == [None, *ENV_NAMES, PLUGIN]
    labels = {c["value"]: c["label"] for c in field["x-choices"]}
    assert labels[PLUGIN] == f"{PLUGIN} (plugin: rlp-env-form 1.2.3)" and labels["textarena"] == "textarena"
    assert MODULE not in sys.modules  # found by its metadata alone
    engine_catalogue.cache_clear()
    settings.ENGINE_PYTHON = engine_with(tmp_path, [])  # another image: not installed where runs run
    assert env_name_field(member, team)["enum"] == [None, *ENV_NAMES]


@pytest.mark.parametrize(
    "env, data, field",
    [
        ({"name": "textarena", "kwargs": {"env_id": "Nope-v0"}}, {"env_id": "Nope-v0"}, "config.env.kwargs"),
        ({"name": "textarena"}, {"env_id": "GuessTheNumber-v0"}, "config.env.kwargs"),
        ({"name": "textarena", "kwargs": {"env_id": "GuessTheNumber-v0"}}, {}, "config.data.env_id"),
        ({"name": "no_such_env"}, None, "config.env.name"),
        ({"name": "answer_feedback", "kwargs": {"attempts": 0}}, None, "config.env.kwargs"),
    ],
)
def test_a_bad_environment_is_a_400_naming_the_field(team, member, env, data, field):
    config = {**demo_config(), "env": env}
    if data is not None:
        config["data"] = {"source": "textarena", **data}
    body = {"project": team["project"].pk, "name": "game", "config": config}
    resp = member.post("/api/experiments", body, format="json")
    assert resp.status_code == 400, resp.json()
    assert list(resp.json()["errors"]) == [field], resp.json()
    assert not Experiment.objects.exists()


def test_a_textarena_experiment_is_accepted(team, member):
    game = "GuessTheNumber-v0"
    config = {
        **demo_config(),
        "env": {"name": "textarena", "kwargs": {"env_id": game}},
        "data": {"source": "textarena", "env_id": game},
    }
    resp = member.post(
        "/api/experiments", {"project": team["project"].pk, "name": "g", "config": config}, format="json"
    )
    assert resp.status_code == 201, resp.json()

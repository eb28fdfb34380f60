"""The rewards and tasks of the ENGINE's environment on the platform: ``GET /api/rewards``,
``GET /api/tasks``, ``rlp rewards``, and the config check that refuses a reward the engine lacks.

The engine's environment is this test environment unless ``ENGINE_PYTHON`` says otherwise: it holds the
example reward plugin (``plugins/rlp-reward-units``, installed by ``make install``). A different engine
environment — another image, where the plugin is not installed — is simulated by a stand-in
interpreter: a small script set as ``ENGINE_PYTHON`` that prints a catalogue without the plugin.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import engine_catalogue
from experiments.models import Experiment
from rl_engine.config import names as config_names
from tests.conftest import REPO_ROOT
from tests.factories import demo_config
from tests.platform.conftest import client_for

PLUGIN = "unit_conversion"


@pytest.fixture(autouse=True)
def fresh_catalogue():
    engine_catalogue.cache_clear()
    yield
    engine_catalogue.cache_clear()


@pytest.fixture
def member(team):
    return client_for(team["member"])


def create_body(team, reward: dict) -> dict:
    return {"project": team["project"].pk, "name": "plugin", "config": {**demo_config(), "reward": reward}}


def stand_in_engine(tmp_path: Path, rewards: list[dict], calls: Path | None = None) -> str:
    """A stand-in for another image's interpreter: it answers ``-m rl_engine rewards --json`` with
    ``rewards`` (and counts its calls in ``calls``), whatever else it is asked."""
    script = tmp_path / "engine-python"
    answer = json.dumps({"rewards": rewards, "refused": []})
    count = f'echo x >> "{calls}"\n' if calls else ""
    script.write_text(f"#!/bin/sh\n{count}cat <<'EOF'\n{answer}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


BUILT_INS_ONLY = [{"name": n, "origin": "builtin", "parameters": []} for n in config_names.REWARDS.names]


def test_the_api_lists_the_engines_rewards_with_the_installed_plugin(team, member):
    resp = member.get("/api/rewards")
    assert resp.status_code == 200, resp.content
    by_name = {r["name"]: r for r in resp.json()["rewards"]}
    assert set(config_names.REWARDS.names) <= set(by_name)
    assert by_name["exact_match"]["origin"] == "builtin"
    assert {"name": "prefix_credit", "type": "float", "required": False, "default": 0.0} in by_name[
        "exact_match"
    ]["parameters"]
    units = by_name[PLUGIN]
    assert (units["origin"], units["package"], units["version"]) == ("plugin", "rlp-reward-units", "0.1.0")
    assert [(p["name"], p["type"], p["default"]) for p in units["parameters"]] == [
        ("rel_tol", "float", 0.01),
        ("require_unit", "bool", True),
    ]
    assert units["description"]
    assert client_for().get("/api/rewards").status_code in (401, 403)  # members of the platform only


def test_the_api_lists_the_engines_tasks(member):
    resp = member.get("/api/tasks")
    assert resp.status_code == 200, resp.content
    tasks = {t["name"]: t for t in resp.json()["tasks"]}
    assert set(tasks) == set(config_names.TASKS.names)
    assert tasks["reverse"]["parameters"] == [
        {"name": "length", "type": "int", "required": False, "default": 3},
        {"name": "alphabet", "type": "str", "required": False, "default": "abcdef"},
    ]
    # the reasoning-gym datasets a config may name, with their config fields (the engine's answer)
    datasets = {d["name"]: d for d in resp.json()["reasoning_gym"]}
    assert "chain_sum" in datasets and not set(datasets) & config_names.REASONING_GYM_REFUSED
    assert datasets["chain_sum"]["source"].startswith("reasoning-gym ")
    assert {"name": "max_terms", "type": "int", "required": False, "default": 6} in datasets["chain_sum"][
        "parameters"
    ]


def test_a_plugin_the_engine_has_is_accepted(team, member):
    resp = member.post("/api/experiments", create_body(team, {"name": PLUGIN}), format="json")
    assert resp.status_code == 201, resp.json()


def test_a_reward_the_engines_environment_lacks_is_a_400_naming_the_field(team, member, settings, tmp_path):
    calls = tmp_path / "calls"
    settings.ENGINE_PYTHON = stand_in_engine(tmp_path, BUILT_INS_ONLY, calls)
    resp = member.post("/api/experiments", create_body(team, {"name": PLUGIN}), format="json")
    assert resp.status_code == 400, resp.json()
    [message] = resp.json()["errors"]["config.reward.name"]
    assert f"the engine where runs run offers no reward {PLUGIN!r}" in message
    combined = {"combine": [{"name": "contains"}, {"name": PLUGIN, "kwargs": {"rel_tol": 0.1}}]}
    resp = member.post("/api/experiments", create_body(team, combined), format="json")
    assert resp.status_code == 400
    assert list(resp.json()["errors"]) == ["config.reward.combine[1].name"]
    assert not Experiment.objects.exists()
    resp = member.post("/api/experiments", create_body(team, {"name": "contains"}), format="json")
    assert resp.status_code == 201, resp.json()  # the built-ins are there
    assert PLUGIN not in {r["name"] for r in member.get("/api/rewards").json()["rewards"]}
    assert len(calls.read_text().split()) == 1  # asked once, then cached


def test_an_engine_that_does_not_answer_refuses_plugins_only(team, member, settings, tmp_path):
    settings.ENGINE_PYTHON = str(tmp_path / "no-such-python")
    resp = member.get("/api/rewards")
    assert resp.status_code == 503 and "did not start" in resp.json()["detail"]
    resp = member.post("/api/experiments", create_body(team, {"name": PLUGIN}), format="json")
    assert resp.status_code == 400
    [message] = resp.json()["errors"]["config.reward.name"]
    assert "cannot be checked" in message
    resp = member.post("/api/experiments", create_body(team, {"name": "contains"}), format="json")
    assert resp.status_code == 201, resp.json()


@pytest.mark.django_db(transaction=True)
def test_rlp_rewards_lists_what_the_api_answers(live_server, team):
    from accounts.services import token_create

    token = token_create(user=team["member"], name="cli").secret
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLP_")}
    env |= {"RLP_URL": live_server.url, "RLP_TOKEN": token, "RLP_CONFIG_DIR": "/nonexistent-rlp",
            "PYTHONPATH": str(REPO_ROOT / "client"), "COLUMNS": "200"}  # fmt: skip

    def rlp(*args: str) -> tuple[int, str, str]:
        proc = subprocess.run([sys.executable, "-m", "rlp_client", *args], env=env, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        return proc.returncode, proc.stdout, proc.stderr

    code, out, err = rlp("rewards", "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer == client_for(team["member"]).get("/api/rewards").json()
    code, out, err = rlp("rewards")
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert {"exact_match", PLUGIN} <= set(lines)
    assert "rlp-reward-units 0.1.0" in lines[PLUGIN] and "rel_tol=0.01" in lines[PLUGIN]
    assert "built-in" in lines["exact_match"]
    code, out, err = rlp("tasks")
    assert code == 0 and "digits=2" in out, err


def test_the_form_offers_the_plugins_the_engine_has(team, member, settings, tmp_path):
    def reward_choices() -> dict[str, list]:
        schema = member.get(f"/api/schema/experiment?project={team['project'].pk}").json()
        return {
            d: schema["$defs"][d]["properties"]["name"].get("enum")
            for d in ("RewardConfig", "RewardComponent")
        }

    offered = reward_choices()
    for names in offered.values():
        assert names[: len(config_names.REWARDS.names)] == list(config_names.REWARDS.names)
        assert PLUGIN in names
    schema = member.get(f"/api/schema/experiment?project={team['project'].pk}").json()
    labels = {
        c["value"]: c["label"] for c in schema["$defs"]["RewardConfig"]["properties"]["name"]["x-choices"]
    }
    assert labels[PLUGIN] == f"{PLUGIN} (plugin: rlp-reward-units 0.1.0)"
    settings.ENGINE_PYTHON = stand_in_engine(tmp_path, BUILT_INS_ONLY)  # another image: no plugin there
    assert all(names == list(config_names.REWARDS.names) for names in reward_choices().values())

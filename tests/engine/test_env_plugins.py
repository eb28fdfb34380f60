"""Environment plugins (``rl_engine.envs.plugins``, entry-point group ``rl_engine.envs``): a package's
metadata written into a temporary folder on ``sys.path`` registers environments; a config names one like
a built-in (its kwargs checked against the factory), the HF worker plays its episodes on the tiny model;
a name a built-in has is refused, a plugin that does not load is the config's ``env.kwargs`` error."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from rl_engine.config import ConfigError, parse_config
from rl_engine.data import PromptStream
from rl_engine.envs.base import Episode
from rl_engine.envs.calculator import Calculator
from rl_engine.envs.plugins import refresh_plugins, refused
from rl_engine.envs.registry import ENVIRONMENTS, bound_environment, plugin_names
from rl_engine.pipeline.components import real_reward, real_worker

MODULE = "rlp_env_test_fixture"
PLUGIN_CODE = '''
from rl_engine.envs.base import EnvStep


class Nudge:
    """Replies once, then ends the episode with a reward of its own."""

    def __init__(self, reply, reward):
        self.reply, self.reward = reply, reward

    def step(self, episode):
        if episode.turn == 1:
            return EnvStep(done=False, message=self.reply, role="user", figures={"nudged": 1.0})
        return EnvStep(done=True, reward=self.reward, figures={"nudged": 1.0})


def nudge(judge, reply="again", reward=0.25):
    """One more turn after a nudge."""
    if not isinstance(reply, str) or not reply:
        raise ValueError("reply must be a non-empty text")
    return Nudge(reply, reward)
'''


def write_dist(root: Path, name: str, entry_points: dict[str, str]) -> None:
    dist = root / f"{name.replace('-', '_')}-1.2.3.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
    (dist / "entry_points.txt").write_text(f"[rl_engine.envs]\n{lines}\n")


@pytest.fixture
def installed_plugins(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(PLUGIN_CODE))
    write_dist(
        tmp_path,
        "rlp-env-fixture",
        {
            "nudge": f"{MODULE}:nudge",
            "calculator": f"{MODULE}:nudge",  # a built-in's name: refused
            "broken_env": "no_such_module_here:factory",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    refresh_plugins()
    yield
    monkeypatch.undo()
    sys.modules.pop(MODULE, None)
    refresh_plugins()


def config(env: dict) -> dict:
    return {"model": {"path": "m"}, "env": env}


def test_a_config_names_an_installed_environment_like_a_built_in(installed_plugins):
    sys.modules.pop(MODULE, None)
    assert {"nudge", "broken_env"} <= set(plugin_names())
    assert MODULE not in sys.modules  # found by its metadata, not imported
    cfg = parse_config(config({"name": "nudge", "kwargs": {"reply": "more"}}))
    assert cfg.env.name == "nudge" and MODULE in sys.modules  # checking the config loads it
    env = bound_environment("nudge", {"reply": "more"})
    step = env.step(Episode("q", "a", {}, ("x",)))
    assert (step.done, step.message, step.figures) == (False, "more", {"nudged": 1.0})
    assert env.step(Episode("q", "a", {}, ("x", "y"), ("more",))).reward == 0.25


def test_a_plugin_may_not_shadow_a_built_in_environment(installed_plugins):
    [shadow] = [r for r in refused(ENVIRONMENTS) if r.package == "rlp-env-fixture"]
    assert shadow.name == "calculator"
    assert "it would shadow the built-in environment 'calculator'" in shadow.reason
    assert isinstance(bound_environment("calculator", {}), Calculator)  # still the built-in


@pytest.mark.parametrize(
    "env, field, message",
    [
        ({"name": "nudge", "kwargs": {"reply": ""}}, "env.kwargs", "reply must be a non-empty text"),
        ({"name": "nudge", "kwargs": {"colour": 1}}, "env.kwargs", "it takes: reply, reward"),
        (
            {"name": "broken_env"},
            "env.kwargs",
            "environment plugin 'broken_env' (rlp-env-fixture 1.2.3, no_such_module_here:factory) "
            "failed to load: ModuleNotFoundError",
        ),
        ({"name": "chess"}, "env.name", "installed plugins: broken_env, nudge"),
    ],
)
def test_a_bad_plugin_setting_names_the_field(installed_plugins, env, field, message):
    with pytest.raises(ConfigError) as err:
        parse_config(config(env))
    [(where, text)] = err.value.errors
    assert where == field and message in text, text


def test_without_the_package_its_name_is_unknown():
    refresh_plugins()
    with pytest.raises(ConfigError) as err:
        parse_config(config({"name": "nudge"}))
    assert err.value.errors[0][0] == "env.name"


def test_the_hf_worker_plays_a_plugins_episodes(installed_plugins, make_cfg):
    cfg = make_cfg(
        "env.name=nudge",
        "env.kwargs={reply: again, reward: 0.25}",
        "env.max_turn_tokens=4",
        "rollout.max_new_tokens=48",
        "rollout.n=2",
    )
    worker = real_worker(cfg)
    samples = worker.generate(PromptStream(cfg, worker.tokenizer).next_batch(2), cfg.rollout.n)
    reward = real_reward(cfg)
    for s in samples:
        assert s.extra["env/turns"] == 2.0 and s.extra["env/nudged"] == 1.0
        assert 0 in s.loss_mask and reward(s) == 0.25


def test_the_cli_lists_the_environments_by_their_metadata(installed_plugins, capsys):
    import json

    from rl_engine.cli import main

    sys.modules.pop(MODULE, None)
    assert main(["envs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    by_name = {e["name"]: e for e in listed["envs"]}
    assert [n for n, e in by_name.items() if e["origin"] == "builtin"] == sorted(ENVIRONMENTS)
    assert by_name["nudge"] == {
        "name": "nudge",
        "description": "",
        "origin": "plugin",
        "package": "rlp-env-fixture",
        "version": "1.2.3",
    }
    assert "broken_env" in by_name  # listed by metadata: whether it loads is the config's check
    assert [(r["name"], r["package"]) for r in listed["refused"]] == [("calculator", "rlp-env-fixture")]
    assert MODULE not in sys.modules  # nothing imported
    assert main(["envs"]) == 0
    assert "nudge\trlp-env-fixture 1.2.3" in capsys.readouterr().out

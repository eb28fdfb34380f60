"""Reward plugins: rewards that installed packages register under the entry-point group
``rl_engine.rewards`` (docs/engine.md, "Reward plugins").

The main tests use the repository's example plugin, ``plugins/rlp-reward-units`` (``make install``
installs it): found by its real entry point, named in a config like a built-in, its kwargs checked at
parse, its mapping result's figures step metrics. Its second entry point, ``rlp_units_test_fixture``,
is a test fixture that raises, returns NaN or hangs on purpose. Only the shadowing test writes a
package's metadata into a temporary folder on ``sys.path``.
"""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import pytest

from rl_engine.config import ConfigError, parse_config
from rl_engine.config import names as config_names
from rl_engine.pipeline.metrics import step_metrics
from rl_engine.rewards import build_reward, component_means
from rl_engine.rewards.plugins import describe_factory, load_factory
from rl_engine.rewards.registry import plugin_entry_point, plugin_names, reward_catalogue
from rl_engine.types import QueueStats, Sample, StepResult

PLUGIN = "unit_conversion"
FIXTURE = "rlp_units_test_fixture"


def config(reward: dict, **extra) -> dict:
    return {"model": {"path": "m"}, "reward": reward, **extra}


def sample(response: str, answer: str) -> Sample:
    return Sample("p", "g", [], [], [], "stop", 0, 0, response_text=response, answer=answer)


def test_the_example_plugin_is_found_by_its_entry_point_without_being_imported():
    config_names.refresh_reward_plugins()
    sys.modules.pop("rlp_reward_units.units", None)
    sys.modules.pop("rlp_reward_units", None)
    found = config_names.reward_plugins()
    assert {PLUGIN, FIXTURE} <= set(found) and {PLUGIN, FIXTURE} <= set(plugin_names())
    assert found[PLUGIN].value == "rlp_reward_units.units:unit_conversion"
    assert config_names.plugin_package(found[PLUGIN]) == ("rlp-reward-units", "0.1.0")
    assert "rlp_reward_units" not in sys.modules  # discovery reads metadata only
    parse_config(config({"name": PLUGIN}))  # checking the config loads it (its kwargs are checked)
    assert "rlp_reward_units.units" in sys.modules


def test_a_config_names_a_plugin_like_a_built_in_and_it_scores():
    cfg = parse_config(config({"name": PLUGIN, "kwargs": {"rel_tol": 0.05}, "timeout_s": 5}))
    reward = build_reward(cfg.reward)
    assert reward.timeout_s == 5.0  # a plugin runs with its time limit; built-ins run inline
    assert build_reward(parse_config(config({"name": "exact_match"})).reward).timeout_s is None
    batch = [sample("so 2500 m", "2.5 km"), sample("2400 m", "2.5 km"), sample("2 kg", "2.5 km")]
    assert [reward(s) for s in batch] == [1.0, 1.0, 0.0]
    assert reward.errors == 0


def test_a_plugin_is_a_component_of_a_combination():
    cfg = parse_config(
        config(
            {
                "combine": [
                    {"name": PLUGIN, "label": "units", "weight": 1.0},
                    {"name": "contains", "weight": 0.5},
                ]
            }
        )
    )
    combined = build_reward(cfg.reward)
    s = sample("2.5 km", "2.5 km")
    assert combined(s) == 1.5
    assert s.extra["reward/units"] == 1.0 and s.extra["reward/contains"] == 1.0


@pytest.mark.parametrize(
    ("reward", "path", "message"),
    [
        ({"name": PLUGIN, "kwargs": {"rel_tol": 5}}, "reward.kwargs", "rel_tol must be"),
        ({"name": PLUGIN, "kwargs": {"tolerance": 0.1}}, "reward.kwargs", "it takes: rel_tol, require_unit"),
        (
            {"combine": [{"name": "contains"}, {"name": PLUGIN, "kwargs": {"require_unit": "yes"}}]},
            "reward.combine[1].kwargs",
            "require_unit must be",
        ),
        ({"name": "unit_conversions"}, "reward.name", "installed plugins: rlp_units_test_fixture, unit_conv"),
        ({"name": PLUGIN, "timeout_s": 0}, "reward.timeout_s", "greater than 0"),
    ],
)
def test_a_plugins_kwargs_are_checked_when_the_config_is_parsed(reward, path, message):
    with pytest.raises(ConfigError) as info:
        parse_config(config(reward))
    [(where, msg)] = info.value.errors
    assert where == path and message in msg, (where, msg)


def test_the_schema_still_offers_the_built_ins_only():
    from rl_engine.config import experiment_json_schema

    field = experiment_json_schema()["$defs"]["RewardConfig"]["properties"]["name"]
    assert field["enum"] == list(config_names.REWARDS.names)


def test_a_mapping_results_figures_become_step_metrics():
    single = build_reward(parse_config(config({"name": PLUGIN})).reward)
    combined = build_reward(
        parse_config(config({"combine": [{"name": PLUGIN, "label": "units"}, {"name": "contains"}]})).reward
    )
    batch = [sample("2500 m", "2.5 km"), sample("2000 m", "2.5 km"), sample("nothing", "2.5 km")]
    rewards = [single(s) for s in batch]
    assert rewards == [1.0, 0.0, 0.0]
    assert component_means([s.extra for s in batch]) == {
        "reward/unit_conversion/parsed/mean": 2 / 3,
        "reward/unit_conversion/rel_error/mean": pytest.approx(0.1),  # of the two that parsed
    }
    again = [sample(s.response_text, s.answer) for s in batch]
    totals = [combined(s) for s in again]
    parts = component_means([s.extra for s in again])
    assert set(parts) == {
        "reward/units/mean",
        "reward/units/parsed/mean",
        "reward/units/rel_error/mean",
        "reward/contains/mean",
    }
    result = StepResult(
        version=1,
        trainer_metrics={},
        wait_s=0.0,
        train_s=0.1,
        dropped_now=0,
        staleness=[0] * 3,
        rewards=totals,
        lengths=[1] * 3,
        partial=[False] * 3,
        gen_s=[0.0] * 3,
        uids=["0", "1", "2"],
        examples=[],
        reward_parts=parts,
    )
    metrics = step_metrics(
        result,
        step_wall_s=1.0,
        sync_s=None,
        queue_stats=QueueStats(
            queued=0, max_depth=0, admitted=0, generated=0, consumed=0, dropped_stale=0, failure=None
        ),
        rollout_busy_delta_s=[],
        gen_window_s=1.0,
    )
    assert metrics["reward/units/parsed/mean"] == pytest.approx(2 / 3)
    assert metrics["reward/units/mean"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("behaviour", ["raise", "nan"])
def test_a_plugin_that_raises_or_returns_nan_scores_as_an_error(behaviour):
    reward = build_reward(parse_config(config({"name": FIXTURE, "kwargs": {"behaviour": behaviour}})).reward)
    batch = [sample("x", "1") for _ in range(3)]
    assert [reward(s) for s in batch] == [0.0, 0.0, 0.0]
    assert [s.extra["reward_error"] for s in batch] == [1.0, 1.0, 1.0]
    assert reward.stats() == {
        "reward/errors": 3.0,
        "reward/calls": 3.0,
        "reward/unscored": 0.0,
        "reward/timeouts": 0.0,
    }


@pytest.mark.parametrize(
    "result",
    [{"parsed": 1.0}, {"score": 1.0, "bad name": 1.0}, {"score": 1.0, "x": math.inf}, {"score": "high"}],
)
def test_a_malformed_mapping_scores_as_an_error(result):
    from rl_engine.rewards.base import SafeReward

    reward = SafeReward(lambda s: result, "m", timeout_s=5.0)
    s = sample("x", "1")
    assert reward(s) == 0.0 and s.extra == {"reward_error": 1.0}


@pytest.mark.timeout(60)
def test_a_hanging_plugin_is_cut_off_and_then_closed():
    """Each call waits at most ``timeout_s``; after ``MAX_HANGS`` abandoned calls the reward is not
    called again: every later sample is an error at once (the scorer returns, no thread piles up)."""
    from rl_engine.rewards.base import MAX_HANGS

    cfg = parse_config(
        config(
            {
                "combine": [
                    {"name": FIXTURE, "kwargs": {"behaviour": "hang", "seconds": 120}, "label": "hangs"},
                    {"name": "contains"},
                ],
                "timeout_s": 0.2,
            }
        )
    )
    combined = build_reward(cfg.reward)
    batch = [sample("7", "7") for _ in range(MAX_HANGS + 3)]
    totals = [combined(s) for s in batch]
    assert totals == [1.0] * len(batch)  # the hung component scores 0, the other one still counts
    assert all(s.extra["reward_error"] == 1.0 and s.extra["reward/hangs"] == 0.0 for s in batch)
    hanging = combined.parts[0][2]
    assert hanging.closed and hanging.timeouts == MAX_HANGS
    assert combined.stats() == {
        "reward/errors": float(len(batch)),
        "reward/calls": float(len(batch)),
        "reward/unscored": 0.0,
        "reward/timeouts": float(MAX_HANGS),
    }


def _write_dist(root: Path, name: str, entry_points: dict[str, str]) -> None:
    dist = root / f"{name.replace('-', '_')}-1.2.3.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
    (dist / "entry_points.txt").write_text(f"[rl_engine.rewards]\n{lines}\n")


def test_a_plugin_may_not_shadow_a_built_in(tmp_path, monkeypatch):
    (tmp_path / "shadowing_plugin.py").write_text(
        textwrap.dedent(
            '''
            def always_one(**kwargs):
                """Scores 1 whatever the response."""
                return lambda sample: 1.0
            '''
        )
    )
    _write_dist(
        tmp_path,
        "shadowing-plugin",
        {"exact_match": "shadowing_plugin:always_one", "always_one": "shadowing_plugin:always_one"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config_names.refresh_reward_plugins()
    try:
        [refused] = [r for r in config_names.refused_reward_plugins() if r.package == "shadowing-plugin"]
        assert refused.name == "exact_match" and "shadow the built-in reward 'exact_match'" in refused.reason
        assert "always_one" in config_names.reward_plugins()
        assert config_names.reward_plugins().get("exact_match") is None
        em = build_reward(parse_config(config({"name": "exact_match"})).reward)
        assert em(sample("no", "yes")) == 0.0  # still the built-in
        assert (
            describe_factory(load_factory(plugin_entry_point("always_one")))["description"]
            == "Scores 1 whatever the response."
        )
        listed = reward_catalogue()
        assert {
            "name": "exact_match",
            "package": "shadowing-plugin",
            "entry_point": "shadowing_plugin:always_one",
            "reason": refused.reason,
        } in listed["refused"]
        assert [r["origin"] for r in listed["rewards"] if r["name"] == "exact_match"] == ["builtin"]
    finally:
        monkeypatch.undo()
        config_names.refresh_reward_plugins()


def test_a_plugin_that_does_not_load_is_a_kwargs_error(tmp_path, monkeypatch):
    _write_dist(tmp_path, "broken-plugin", {"broken_reward": "no_such_module_here:factory"})
    monkeypatch.syspath_prepend(str(tmp_path))
    config_names.refresh_reward_plugins()
    try:
        with pytest.raises(ConfigError) as info:
            parse_config(config({"name": "broken_reward"}))
        [(where, msg)] = info.value.errors
        assert where == "reward.kwargs" and "failed to load: ModuleNotFoundError" in msg, msg
        assert "broken-plugin 1.2.3" in msg
        [listed] = [r for r in reward_catalogue()["rewards"] if r["name"] == "broken_reward"]
        assert listed["package"] == "broken-plugin" and "failed to load" in listed["error"]
    finally:
        monkeypatch.undo()
        config_names.refresh_reward_plugins()


def _engine_cli(*args: str) -> dict:
    import json
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "rl_engine", *args], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout)


def test_the_engine_lists_its_rewards_with_their_parameters_and_origin():
    catalogue = _engine_cli("rewards", "--json")
    by_name = {r["name"]: r for r in catalogue["rewards"]}
    assert set(config_names.REWARDS.names) | {PLUGIN, FIXTURE} <= set(by_name)
    assert by_name["exact_match"]["origin"] == "builtin"
    assert by_name["format"]["parameters"][0] == {"name": "pattern", "type": "str", "required": True}
    units = by_name[PLUGIN]
    assert (units["origin"], units["package"], units["version"]) == ("plugin", "rlp-reward-units", "0.1.0")
    assert units["parameters"] == [
        {"name": "rel_tol", "type": "float", "required": False, "default": 0.01},
        {"name": "require_unit", "type": "bool", "required": False, "default": True},
    ]
    assert units["description"].startswith("1.0 when the response's last quantity equals the answer's")
    assert catalogue["refused"] == []


def test_the_engine_lists_its_tasks():
    tasks = {t["name"]: t for t in _engine_cli("tasks", "--json")["tasks"]}
    assert set(tasks) == set(config_names.TASKS.names)
    assert tasks["add"]["parameters"] == [{"name": "digits", "type": "int", "required": False, "default": 2}]
    assert tasks["add"]["origin"] == "builtin" and tasks["add"]["description"].startswith("``23+45=``")


def test_the_engine_lists_the_reasoning_gym_datasets_with_their_config_fields():
    """``tasks --json`` lists the reasoning-gym datasets a config may name: chain_sum with the fields of
    its config dataclass (``seed`` and ``size`` are the engine's) and their defaults; no refused one."""
    import dataclasses

    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    catalogue = _engine_cli("tasks", "--json")
    assert catalogue["reasoning_gym_error"] is None
    datasets = {d["name"]: d for d in catalogue["reasoning_gym"]}
    assert set(datasets) == set(config_names.REASONING_GYM_DATASETS.names) & set(DATASETS)
    assert not set(datasets) & config_names.REASONING_GYM_REFUSED
    chain_sum = datasets["chain_sum"]
    assert chain_sum["source"] == f"reasoning-gym {reasoning_gym.__version__}"
    assert chain_sum["data_source"] == "reasoning_gym"
    config_cls = DATASETS["chain_sum"][1]
    expected = {f.name: f.default for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")}
    assert {p["name"]: p["default"] for p in chain_sum["parameters"]} == expected
    assert {"name": "max_terms", "type": "int", "required": False, "default": 6} in chain_sum["parameters"]
    assert {p["name"]: p["type"] for p in chain_sum["parameters"]}["allow_negation"] == "bool"

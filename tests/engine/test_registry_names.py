"""The names a config may hold (``rl_engine.config.names``, torch-free) are exactly what the engine's
registries hold: the config checks a name against its list (a misspelt one is a field error that lists
the names), its JSON Schema offers them as an enum (the form's dropdowns), and the job looks them up in
the registry."""

from __future__ import annotations

import pytest
import torch

from rl_engine.algos.advantages import ADVANTAGES
from rl_engine.algos.losses import AGGREGATIONS, OFF_POLICY_WEIGHTS
from rl_engine.config import ConfigError, experiment_json_schema, parse_config
from rl_engine.config import names as config_names
from rl_engine.data.tasks import TASKS
from rl_engine.rewards.registry import REWARDS

# field path -> (the config's list, the implementation registry, the field's schema definition)
CASES = {
    "reward.name": (config_names.REWARDS, REWARDS, "RewardConfig"),
    "data.task": (config_names.TASKS, TASKS, "TaskDataConfig"),
    "algorithm.advantage": (config_names.ADVANTAGES, ADVANTAGES, "AlgorithmConfig"),
    "algorithm.loss_agg": (config_names.LOSS_AGGREGATIONS, AGGREGATIONS, "AlgorithmConfig"),
    "algorithm.off_policy": (config_names.OFF_POLICY, OFF_POLICY_WEIGHTS, "AlgorithmConfig"),
}


# What a name needs of the rest of the config (the reasoning_gym reward scores reasoning-gym prompts).
NEEDS = {
    ("reward.name", "reasoning_gym"): {
        "data": {"source": "reasoning_gym", "datasets": [{"name": "chain_sum"}]}
    }
}


def config_with(path: str, value: str) -> dict:
    section, field = path.split(".")
    return {"model": {"path": "m"}, **NEEDS.get((path, value), {}), section: {field: value}}


def test_every_list_of_names_is_checked_here():
    assert set(config_names.REGISTRIES) == {names for names, _, _ in CASES.values()}


@pytest.mark.parametrize("path", list(CASES))
def test_the_configs_names_are_exactly_the_registrys_in_its_order(path):
    names, registry, _ = CASES[path]
    assert names.names == tuple(registry)


@pytest.mark.parametrize("path", list(CASES))
def test_the_schema_offers_the_registrys_names(path):
    _, registry, definition = CASES[path]
    field = experiment_json_schema()["$defs"][definition]["properties"][path.split(".")[1]]
    assert field["enum"] == list(registry)


@pytest.mark.parametrize("path", list(CASES))
def test_every_registered_name_is_accepted(path):
    _, registry, _ = CASES[path]
    for name in registry:
        cfg = parse_config(config_with(path, name))
        section, field = path.split(".")
        assert getattr(getattr(cfg, section), field) == name


@pytest.mark.parametrize("path", list(CASES))
def test_a_misspelt_name_is_refused_at_its_field_with_the_names_to_choose_from(path):
    names, registry, _ = CASES[path]
    misspelt = next(iter(registry)) + "x"
    with pytest.raises(ConfigError) as info:
        parse_config(config_with(path, misspelt))
    # a reward may also be an installed plugin (tests/engine/test_reward_plugins.py): those are listed too
    plugins = sorted(config_names.reward_plugins()) if path == "reward.name" else []
    also = f"; installed plugins: {', '.join(plugins)}" if plugins else ""
    assert info.value.errors == [
        (path, f"unknown {names.what} {misspelt!r}; choose one of {', '.join(sorted(registry))}{also}")
    ]


def test_the_estimators_that_need_a_group_are_those_whose_singleton_groups_learn_nothing():
    # The config asks rollout.n >= 2 of WITHIN_GROUP: the estimators whose baseline is the rest of the
    # group give a response alone in its group no advantage, whatever its reward.
    rewards, groups = torch.tensor([1.0, 0.0, 3.0, 0.5]), torch.arange(4)
    learns_nothing = {name for name, fn in ADVANTAGES.items() if fn(rewards, groups).abs().max() == 0}
    assert learns_nothing == config_names.WITHIN_GROUP

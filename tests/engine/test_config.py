"""The experiment config schema: validation messages with field paths, overrides, YAML, JSON Schema."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_engine.config import (
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    dump_yaml,
    experiment_json_schema,
    fork_config,
    joined,
    load_yaml,
    parse_config,
    relative,
)
from rl_engine.config.layout import layout
from rl_engine.presets import get_preset, preset_names


def errors_of(data: dict) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return dict(info.value.errors)


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_validates_and_round_trips_through_yaml(name, tmp_path):
    cfg = parse_config(get_preset(name))
    path = tmp_path / "cfg.yaml"
    path.write_text(dump_yaml(cfg))
    assert load_yaml(path) == cfg


def test_gpu_preset_uses_vllm_and_asks_for_gpus():
    cfg = parse_config(get_preset("gsm8k-qwen2.5-1.5b-vllm"))
    assert cfg.rollout.backend == "vllm"
    assert cfg.resources.rollout_gpus >= 1


def test_batch_not_divisible_by_group_size_says_what_to_change():
    errs = errors_of({"model": {"path": "m"}, "rollout": {"n": 3}})
    assert errs == {
        "": "trainer.batch_size (64) must be a multiple of rollout.n (3): each prompt is "
        "answered rollout.n times (try batch_size=63)"
    }


def test_vllm_without_gpus_is_rejected_with_the_field_to_set():
    errs = errors_of({"model": {"path": "m"}, "rollout": {"backend": "vllm"}})
    assert "set resources.rollout_gpus >= 1, or rollout.device 'cpu'" in errs[""]
    errs = errors_of({"model": {"path": "m"}, "rollout": {"backend": "sglang"}})
    assert "set resources.rollout_gpus >= 1" in errs[""]


def test_vllm_on_cpu_needs_no_gpu_and_takes_gloo_or_the_object_store():
    rollout = {"backend": "vllm", "device": "cpu"}
    for sync in ("object_store", "gloo"):
        cfg = parse_config({"model": {"path": "m"}, "rollout": rollout, "pipeline": {"sync_backend": sync}})
        assert (cfg.rollout.device, cfg.resources.rollout_gpus) == ("cpu", 0)
    errs = errors_of(
        {
            "model": {"path": "m"},
            "rollout": rollout,
            "resources": {"rollout_gpus": 1, "trainer_gpus": 1},
            "pipeline": {"sync_backend": "nccl"},
        }
    )
    assert "vLLM's CPU build has no NCCL; use 'gloo' or 'object_store'" in errs[""]


def test_sync_backends_that_cannot_work_are_refused_with_what_to_use():
    base = {"model": {"path": "m"}, "resources": {"rollout_gpus": 1}}
    errs = errors_of({**base, "pipeline": {"sync_backend": "nccl"}})
    assert "set resources.trainer_gpus >= 1 and resources.rollout_gpus >= 1" in errs[""]
    assert (
        parse_config({"model": {"path": "m"}, "pipeline": {"sync_backend": "gloo"}}).pipeline.sync_timeout_s
        > 0
    )


def test_field_errors_carry_paths_without_union_tags():
    errs = errors_of(
        {"model": {"path": "m"}, "rollout": {"backend": "hf", "n": "many", "bogus": 1}, "trainer": {"lr": -1}}
    )
    assert set(errs) == {"rollout.n", "rollout.bogus", "trainer.lr"}
    assert "valid integer" in errs["rollout.n"]
    assert "Extra inputs are not permitted" in errs["rollout.bogus"]


def test_a_field_named_like_its_sections_kind_keeps_its_path():
    # data.source 'task' has a field 'task': pydantic's location ('data', 'task', 'task') loses the
    # kind once, not twice.
    errs = errors_of({"model": {"path": "m"}, "data": {"source": "task", "task": 5}})
    assert list(errs) == ["data.task"]


def test_the_kinds_of_a_section_are_those_the_json_schema_declares():
    # What error paths drop and what a fork keeps (layout) is read from the models; the JSON Schema
    # pydantic writes for the form is the independent statement of the same unions.
    schema = experiment_json_schema()
    declared = {
        name: (prop["discriminator"]["propertyName"], sorted(prop["discriminator"]["mapping"]))
        for name, prop in schema["properties"].items()
        if "discriminator" in prop
    }
    unions = layout(ExperimentConfig).unions
    assert {path: (u.tag, sorted(u.variants)) for path, u in unions.items()} == declared
    assert declared == {
        "rollout": ("backend", ["hf", "sglang", "vllm"]),
        "data": ("source", ["dataset", "jsonl", "reasoning_gym", "task", "textarena"]),
    }


def test_missing_variant_tags_default_to_hf_and_task():
    cfg = parse_config({"model": {"path": "m"}, "rollout": {"n": 4}, "data": {"task": "reverse"}})
    assert (cfg.rollout.backend, cfg.data.source, cfg.data.task) == ("hf", "task", "reverse")


def test_unknown_backend_is_a_field_error():
    errs = errors_of({"model": {"path": "m"}, "rollout": {"backend": "tgi"}})
    assert list(errs) == ["rollout"]


def test_overrides_parse_yaml_values_and_create_mappings():
    data = apply_overrides(
        get_preset("demo-cpu"),
        [
            "rollout.n=4",
            "trainer.lr=1e-4",
            "logging.log_every=3",
            "algorithm.off_policy=tis",
            "model.override_config.rope_theta=10000",
        ],
    )
    cfg = parse_config(data)
    assert (cfg.rollout.n, cfg.trainer.lr, cfg.logging.log_every) == (4, 1e-4, 3)
    assert cfg.algorithm.off_policy == "tis"
    assert cfg.model.override_config == {"rope_theta": 10000}


def test_override_into_a_scalar_or_without_equals_is_a_config_error():
    with pytest.raises(ConfigError, match="not a mapping"):
        apply_overrides({"seed": 1}, ["seed.x=2"])
    with pytest.raises(ConfigError, match=r"must look like key\.path=value"):
        apply_overrides({}, ["seed"])


def test_load_yaml_reports_bad_yaml_with_a_line_and_a_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  path: [unclosed\n")
    with pytest.raises(ConfigError, match=r"not valid YAML \(line \d+, column \d+\)"):
        load_yaml(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_yaml("preset:nope")


def test_json_schema_exposes_the_discriminated_backends_for_the_form():
    schema = experiment_json_schema()
    rollout = schema["properties"]["rollout"]
    assert rollout["discriminator"]["propertyName"] == "backend"
    assert set(rollout["discriminator"]["mapping"]) == {"hf", "vllm", "sglang"}
    assert "model" in schema["required"]


def test_fork_config_merges_nested_overrides_and_keeps_what_a_checkpoint_needs():
    parent = parse_config(get_preset("demo-cpu"))
    child = fork_config(parent, {"trainer": {"lr": 5e-7}, "algorithm": {"kl_coef": 0.01}})
    assert child.trainer.lr == 5e-7 and child.algorithm.kl_coef == 0.01
    # everything else is the parent's
    expected = parent.model_dump(mode="json")
    expected["trainer"]["lr"], expected["algorithm"]["kl_coef"] = 5e-7, 0.01
    assert child.model_dump(mode="json") == expected
    assert fork_config(parent, {}) == parent
    assert fork_config(parent, {"model": {"dtype": parent.model.dtype}}) == parent  # unchanged: fine

    def paths(overrides) -> set[str]:
        with pytest.raises(ConfigError) as info:
            fork_config(parent, overrides)
        return {p for p, _ in info.value.errors}

    assert paths({"trainer": {"lr": -1}}) == {"trainer.lr"}
    assert paths({"trainer": {"lrr": 1e-6}}) == {"trainer.lrr"}
    assert paths({"model": {"tiny": {"hidden_size": 128}}}) == {"model.tiny"}
    assert paths({"model": {"path": "/elsewhere"}, "trainer": {"lr": 1e-6}}) == {"model.path"}
    assert paths({"pipeline": {"num_rollouters": parent.pipeline.num_rollouters + 1}}) == {
        "pipeline.num_rollouters"
    }
    assert paths({"trainer": {"betas": {"first": 0.9}}}) == {"trainer.betas"}
    assert paths([1]) == {""}  # type: ignore[arg-type]


def test_a_fork_may_change_the_kind_of_rollout_or_data_keeping_the_fields_both_kinds_have():
    """hf -> vllm, task -> jsonl: the old kind's own fields are dropped (they were refused as unknown), the
    fields the new kind has too keep the parent's values, the rest take the new kind's defaults."""
    from rl_engine.config import JsonlDataConfig, VLLMRolloutConfig

    parent = parse_config(get_preset("demo-cpu"))
    child = fork_config(
        parent,
        {
            "data": {"source": "jsonl", "path": "/data/prompts.jsonl", "truncation_side": "right"},
            "rollout": {"backend": "vllm", "device": "cpu", "temperature": 0.7},
        },
    )
    assert isinstance(child.rollout, VLLMRolloutConfig) and isinstance(child.data, JsonlDataConfig)
    # The reference: each new kind built from its own defaults, then the parent's shared fields, then the
    # overrides.
    before = parent.model_dump(mode="json")
    shared_rollout = {k: v for k, v in before["rollout"].items() if k in VLLMRolloutConfig.model_fields}
    want_rollout = VLLMRolloutConfig(
        **{**shared_rollout, "backend": "vllm", "device": "cpu", "temperature": 0.7}
    )
    shared_data = {k: v for k, v in before["data"].items() if k in JsonlDataConfig.model_fields}
    want_data = JsonlDataConfig(
        **{**shared_data, "source": "jsonl", "path": "/data/prompts.jsonl", "truncation_side": "right"}
    )
    assert child.rollout == want_rollout and child.data == want_data
    assert child.rollout.max_new_tokens == parent.rollout.max_new_tokens != VLLMRolloutConfig().max_new_tokens
    assert "task_kwargs" in before["data"] and "micro_batch_size" in before["rollout"]  # really dropped
    # the same kind again merges as before; an unknown kind is still refused by name
    assert fork_config(parent, {"rollout": {"backend": "hf", "n": 4}}).rollout.micro_batch_size == (
        parent.rollout.micro_batch_size
    )
    with pytest.raises(ConfigError) as info:
        fork_config(parent, {"data": {"source": "parquet"}})
    assert {p for p, _ in info.value.errors} == {"data"}


# --- bounded numbers: seeds, resources, finite floats ---------------------------------------------------

SEED_FIELDS = {
    "seed": {},
    "model.tiny.seed": {"model": {"path": "m", "tiny": {}}},
    "data.synthetic.seed": {"data": {"source": "dataset", "path": "/d", "synthetic": {}}},
}


def _with(base: dict, path: str, value) -> dict:
    import copy

    data = copy.deepcopy({"model": {"path": "m"}, **base})
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return data


@pytest.mark.parametrize("path", list(SEED_FIELDS))
def test_a_seed_is_what_torch_takes_and_a_signed_64_bit_column_holds(path):
    import torch

    base = SEED_FIELDS[path]
    for seed in (0, 1, 2**31, 2**63 - 1):
        parse_config(_with(base, path, seed))
        torch.Generator().manual_seed(seed)  # the engine seeds torch with it
    for seed in (-1, 2**63, 2**64, 2**70):
        assert path in errors_of(_with(base, path, seed))
    with pytest.raises((RuntimeError, ValueError)):
        torch.Generator().manual_seed(2**64)  # torch's own limit, above the schema's


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("resources.rollout_gpus", 100_000),
        ("resources.trainer_gpus", 100_000),
        ("resources.cpus_per_actor", 1e300),
        ("resources.cpus_per_actor", float("inf")),
        ("resources.cpus_per_actor", float("nan")),
        ("resources.trainer_node_resources", {"trainer_node": float("inf")}),
        ("resources.rollout_node_resources", {"rollout_node": -1}),
        ("resources.rollout_node_resources", {"GPU": 1}),
        ("resources.trainer_node_resources", {"CPU": 64}),
        ("resources.trainer_node_resources", {"": 1}),
        ("algorithm.kl_coef", float("inf")),
        ("eval.success_threshold", float("nan")),
        ("trainer.weight_decay", float("inf")),
    ],
)
def test_absurd_or_non_finite_numbers_are_refused_at_their_field(path, value):
    errors = errors_of(_with({}, path, value))
    assert any(p == path or p.startswith(path + ".") for p in errors), errors


def test_custom_resources_with_sane_amounts_are_accepted():
    cfg = parse_config(
        _with({}, "resources", {"cpus_per_actor": 0.5, "trainer_node_resources": {"trainer_node": 1},
                                "rollout_node_resources": {"rollout_node": 0.25}, "rollout_gpus": 8})
    )  # fmt: skip
    assert cfg.resources.trainer_node_resources == {"trainer_node": 1.0}


# --- error paths inside a larger document ----------------------------------------------------------------

NAME = st.from_regex(r"[a-z_]{1,8}", fullmatch=True)
PATHS = st.lists(st.one_of(NAME, st.integers(0, 99).map(lambda i: f"[{i}]")), max_size=4).map(
    lambda parts: ".".join(parts).replace(".[", "[")
)


@given(prefix=NAME, path=PATHS)
def test_a_path_put_under_a_prefix_comes_back_out_of_it(prefix, path):
    inside = joined(prefix, path)
    assert relative(prefix, inside) == path
    assert inside == prefix if not path else inside.startswith(prefix) and inside != prefix


def test_paths_under_a_prefix_read_as_an_api_body_and_a_job_spec_name_them():
    assert joined("config", "trainer.lr") == "config.trainer.lr" and joined("config", "") == "config"
    assert joined("events[2]", "[0].step") == "events[2][0].step" and joined("", "trainer") == "trainer"
    assert relative("config", "placement.ray_address") is None
    assert relative("config", "config_overrides.trainer") is None  # a prefix of the key is not its parent
    err = ConfigError([("trainer.lr", "too big"), ("", "root problem"), ("trainer.lr", "and negative")])
    assert err.under("config").by_path() == {
        "config.trainer.lr": ["too big", "and negative"],
        "config": ["root problem"],
    }

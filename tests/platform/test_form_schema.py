"""The form a project's members write experiments with (``GET /api/schema/experiment?project=ID``,
``experiments.form_schema``): the engine's schema narrowed by the platform's policy. Refused fields are
absent, the model picker offers the catalogue, cluster fields are grouped, and every value the form offers
as a choice is one the policy (``check_config``) accepts."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from experiments.config_policy import check_config
from experiments.form_schema import model_label
from rl_engine.catalogue import describe
from rl_engine.config import ConfigError, experiment_json_schema, parse_config
from tests.platform.conftest import client_for
from tests.platform.test_model_catalogue import write_model


def form(user, project) -> dict:
    resp = client_for(user).get("/api/schema/experiment", {"project": project.pk})
    assert resp.status_code == 200, resp.content
    return resp.json()


def definition(schema: dict, name: str) -> dict:
    return schema["$defs"][name]["properties"]


@pytest.fixture
def deployment(settings, tmp_path):
    """Two catalogue models under a model root, one allowed by its (trailing-slashed) path elsewhere, a
    hub id allowed by name, data under a data root, two MLflow servers (one malformed), a custom resource."""
    settings.MODEL_ROOTS = [tmp_path / "models"]
    write_model(settings.MODEL_ROOTS[0] / "a-llama", head_dim=64)
    write_model(settings.MODEL_ROOTS[0] / "org" / "b-base", hidden=64, heads=4, chat=False)
    write_model(tmp_path / "shared" / "c-allowed")
    settings.ALLOWED_MODELS = [f"{tmp_path / 'shared' / 'c-allowed'}/", "Qwen/Qwen2.5-0.5B"]
    settings.DATA_ROOTS = [tmp_path / "data"]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    settings.ALLOW_DATASET_DOWNLOADS = False
    settings.ALLOWED_MLFLOW_SERVERS = ["https://mlflow.example.org/team", "http://user@bad.example.org"]
    settings.ALLOWED_NODE_RESOURCES = ["trainer_node"]
    settings.RUN_MAX_GPUS = 4
    settings.RUN_MAX_CPUS_PER_ACTOR = 8.0
    return settings


# --- what is absent, narrowed, grouped -------------------------------------------------------------------


def test_a_project_without_remote_code_permission_has_no_trust_remote_code_field(team, deployment):
    project = team["project"]
    assert "trust_remote_code" not in definition(form(team["member"], project), "ModelConfig")
    project.allow_trust_remote_code = True
    project.save(update_fields=["allow_trust_remote_code"])
    assert definition(form(team["member"], project), "ModelConfig")["trust_remote_code"]["type"] == "boolean"


def test_the_model_picker_lists_exactly_the_catalogue(team, deployment):
    models = client_for(team["member"]).get("/api/models").json()["models"]
    path = definition(form(team["member"], team["project"]), "ModelConfig")["path"]
    assert [c["value"] for c in path["x-choices"]] == [m["path"] for m in models]
    assert len(models) == 3 and models[2]["path"].endswith("c-allowed/")  # as ALLOWED_MODELS gives it
    assert (
        path["x-choices"][0]["label"]
        == f"a-llama ({models[0]['parameters'] / 1e3:.1f}K, chat, hf/vllm/sglang/vllm-cpu)"
    )
    assert (
        path["x-choices"][1]["label"].startswith("b-base (")
        and "no chat template" in path["x-choices"][1]["label"]
    )
    # Free text: a folder under the model root, or the allowed hub id; no closed enum then.
    assert "MODEL_ROOTS" in path["x-free-text"] and "Qwen/Qwen2.5-0.5B" in path["x-free-text"]
    assert "enum" not in path
    tokenizer = definition(form(team["member"], team["project"]), "ModelConfig")["tokenizer_path"]
    assert {"type": "null"} in tokenizer["anyOf"]  # still optional
    (offered,) = [m for m in tokenizer["anyOf"] if m.get("type") == "string"]
    assert offered["x-choices"] == path["x-choices"]


def test_a_models_label_says_its_size_chat_template_and_backends(deployment):
    info = describe(deployment.MODEL_ROOTS[0] / "a-llama")
    smollm = replace(info, name="smollm2-135m-instruct", parameters=134_515_008, backends=["hf", "vllm-cpu"])
    assert model_label(smollm) == "smollm2-135m-instruct (134.5M, chat, hf/vllm-cpu)"
    big = replace(info, parameters=1_235_814_400, chat_template=False, remote_code=True)
    assert model_label(big) == "a-llama (1.2B, no chat template, hf/vllm/sglang/vllm-cpu, ships code)"
    assert model_label(replace(info, parameters=None)).startswith("a-llama (size unknown, ")


def test_without_model_roots_the_picker_is_closed_to_the_catalogue(team, deployment):
    deployment.MODEL_ROOTS = []
    deployment.ALLOWED_MODELS = [deployment.ALLOWED_MODELS[0]]
    path = definition(form(team["member"], team["project"]), "ModelConfig")["path"]
    assert path["enum"] == [c["value"] for c in path["x-choices"]] == deployment.ALLOWED_MODELS
    assert "x-free-text" not in path


def test_refused_fields_are_absent_and_narrowed_ones_offer_what_the_policy_allows(team, deployment):
    schema = form(team["member"], team["project"])
    dataset = definition(schema, "DatasetDataConfig")
    assert "cache_dir" not in dataset and "allow_download" not in dataset  # ALLOW_DATASET_DOWNLOADS off
    assert "http" not in definition(schema, "LoggingConfig")["sinks"]["items"]["enum"]
    (uri,) = [
        m for m in definition(schema, "MlflowConfig")["tracking_uri"]["anyOf"] if m.get("type") == "string"
    ]
    assert uri["enum"] == [
        "sqlite:///mlflow.db",
        "https://mlflow.example.org/team",
    ]  # the malformed one is not
    resources = definition(schema, "ResourcesConfig")
    assert resources["trainer_gpus"]["maximum"] == resources["rollout_gpus"]["maximum"] == 4
    assert resources["cpus_per_actor"]["maximum"] == 8.0
    assert resources["trainer_node_resources"]["propertyNames"]["enum"] == ["trainer_node"]

    deployment.ALLOW_DATASET_DOWNLOADS = True
    deployment.ALLOWED_NODE_RESOURCES = []
    schema = form(team["member"], team["project"])
    assert definition(schema, "DatasetDataConfig")["allow_download"]["type"] == "boolean"
    assert not {"trainer_node_resources", "rollout_node_resources"} & set(
        definition(schema, "ResourcesConfig")
    )


def test_what_a_run_asks_of_the_cluster_is_grouped_apart_from_training(team, deployment):
    schema = form(team["member"], team["project"])
    assert schema["properties"]["resources"]["x-group"] == "cluster"
    grouped = {
        (name, field)
        for name, definition_ in schema["$defs"].items()
        for field, prop in definition_.get("properties", {}).items()
        if prop.get("x-group") == "cluster"
    }
    assert {("TrainerConfig", "device"), ("TrainerConfig", "num_threads"), ("HFRolloutConfig", "device"),
            ("HFRolloutConfig", "num_threads"), ("VLLMRolloutConfig", "tensor_parallel_size"),
            ("SGLangRolloutConfig", "tp_size"), ("PipelineConfig", "num_rollouters")} <= grouped  # fmt: skip
    assert not any(schema["$defs"][name]["properties"][field].get("x-essential") for name, field in grouped)
    assert definition(schema, "TrainerConfig")["lr"]["x-essential"] is True  # essentials stay first


def test_the_engines_own_schema_is_still_served_without_a_project(team, deployment):
    assert client_for().get("/api/schema/experiment").json() == experiment_json_schema()


def test_a_projects_form_is_for_its_members_only(team, deployment):
    url = f"/api/schema/experiment?project={team['project'].pk}"
    assert client_for().get(url).status_code == 401
    assert client_for(team["stranger"]).get(url).status_code == 404
    assert client_for(team["viewer"]).get(url).status_code == 200
    assert client_for(team["member"]).get("/api/schema/experiment?project=x").status_code == 400


# --- every choice the form offers, the policy accepts ---------------------------------------------------


@dataclass(frozen=True)
class Offer:
    """A field the form offers a closed set of values for, and the union kinds it belongs to."""

    path: tuple[str, ...]
    values: tuple[Any, ...]
    kinds: tuple[tuple[tuple[str, ...], str], ...]  # (path of the tag field, its value)


def offers(schema: dict) -> list[Offer]:
    """Every field of the form with its choices: enums and labelled choices (``x-choices``), booleans,
    union kinds, the sinks, custom resource names, and the bounds the platform narrows (``resources``)."""
    out: list[Offer] = []

    def deref(node: dict) -> dict:
        while "$ref" in node:
            rest = {k: v for k, v in node.items() if k != "$ref"}
            node = {**schema["$defs"][node["$ref"].rsplit("/", 1)[1]], **rest}
        return node

    def values_of(path: tuple[str, ...], node: dict) -> list[Any] | None:
        if "x-choices" in node:
            return [c["value"] for c in node["x-choices"]]
        if "enum" in node:
            return list(node["enum"])
        if node.get("type") == "boolean":
            return [True, False]
        if node.get("type") == "array" and "enum" in node.get("items", {}):
            return [[v] for v in node["items"]["enum"]] + [list(node["items"]["enum"])]
        if node.get("type") == "object" and "enum" in node.get("propertyNames", {}):
            return [{name: 1.0} for name in node["propertyNames"]["enum"]]
        if path[0] == "resources" and node.get("type") in ("integer", "number"):
            return [node["maximum"], 1]
        return None

    def walk(obj: dict, where: tuple[str, ...], kinds: tuple) -> None:
        for name, prop in obj["properties"].items():
            path, node, nullable = (*where, name), deref(prop), False
            if "anyOf" in node:
                members = [deref(m) for m in node["anyOf"] if m.get("type") != "null"]
                nullable = len(members) < len(node["anyOf"])
                if len(members) != 1:
                    continue
                node = {**members[0], **{k: v for k, v in node.items() if k != "anyOf"}}
            if "discriminator" in node:
                tag = node["discriminator"]["propertyName"]
                for kind, ref in node["discriminator"]["mapping"].items():
                    inside = (*kinds, ((*path, tag), kind))
                    out.append(Offer((*path, tag), (kind,), inside))
                    walk(deref({"$ref": ref}), path, inside)
                continue
            if "const" in node:
                continue
            values = values_of(path, node)
            if values is not None:
                out.append(Offer(path, tuple(values) + ((None,) if nullable else ()), kinds))
            elif "properties" in node:
                walk(node, path, kinds)

    walk(deref(schema), (), ())
    return out


def put(config: dict, path: tuple[str, ...], value: Any) -> None:
    node = config
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = copy.deepcopy(value)


def config_of(base: dict, chosen: list[tuple[Offer, Any]], data_file: Path) -> dict:
    config = copy.deepcopy(base)
    for offer, value in chosen:
        for tag_path, kind in offer.kinds:
            put(config, tag_path, kind)
        put(config, offer.path, value)
    data = config.get("data", {})
    if data.get("source") in ("jsonl", "dataset") and "path" not in data:
        data["path"] = str(data_file)  # the one field of those kinds the form cannot offer a choice for
    return config


def accepted_by_the_policy(config: dict, project) -> bool:
    """True when the engine's schema refuses the config (not the policy's business) or the policy
    accepts it; False (with the policy's reasons raised) otherwise."""
    try:
        cfg = parse_config(config)
    except ConfigError:
        return True
    check_config(cfg, project=project)  # raises ConfigError naming the refused field
    return True


@pytest.fixture(params=["closed", "open"])
def offered(request, team, deployment):
    """The form of two deployments: ``closed`` (no remote code, no downloads) and ``open`` (both
    allowed, any MLflow server, no model root: only the catalogue's allowed folder)."""
    project = team["project"]
    if request.param == "open":
        project.allow_trust_remote_code = True
        project.save(update_fields=["allow_trust_remote_code"])
        deployment.ALLOW_DATASET_DOWNLOADS = True
        deployment.ALLOWED_MLFLOW_SERVERS = ["*"]
        deployment.MODEL_ROOTS = []
    schema = form(team["member"], project)
    first_model = schema["$defs"]["ModelConfig"]["properties"]["path"]["x-choices"][0]["value"]
    return project, offers(schema), {"model": {"path": first_model}}, deployment.DATA_ROOTS[0] / "train.jsonl"


def test_every_single_choice_the_form_offers_is_accepted_by_the_policy(offered):
    project, found, base, data_file = offered
    paths = {".".join(o.path) for o in found}
    assert {"model.path", "model.tokenizer_path", "logging.mlflow.tracking_uri", "logging.sinks",
            "reward.name", "data.task", "rollout.backend", "resources.trainer_gpus"} <= paths  # fmt: skip
    engine_accepted = 0
    for offer in found:
        for value in offer.values:
            config = config_of(base, [(offer, value)], data_file)
            try:
                parse_config(config)
            except ConfigError:
                continue
            engine_accepted += 1
            try:
                accepted_by_the_policy(config, project)
            except ConfigError as exc:
                pytest.fail(f"the form offers {'.'.join(offer.path)} = {value!r}, the policy refuses: {exc}")
    assert engine_accepted > 100  # the walk found the form's fields, not a handful


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.filter_too_much])  # fmt: skip
@given(data=st.data())
def test_choices_the_form_offers_together_are_accepted_by_the_policy(offered, data):
    project, found, base, data_file = offered
    picks = data.draw(st.lists(st.sampled_from(found), min_size=2, max_size=5, unique_by=lambda o: o.path))
    chosen = [(offer, data.draw(st.sampled_from(offer.values))) for offer in picks]
    config = config_of(base, chosen, data_file)
    try:
        parse_config(config)
    except ConfigError:
        assume(False)  # the engine's own cross-field rules (a GPU backend without GPUs ...)
    assert accepted_by_the_policy(config, project)

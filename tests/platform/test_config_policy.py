"""The path policy for configs that come through the platform (docs/api.md, "Trust boundary"): models and
data only under the configured roots (or an allowed model name), trust_remote_code only where an
administrator allowed it; checkpoints / JSONL logs / the Ray address / resume / the trackers' folders are
not in the config at all: the launcher's placement of each run says where they are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from accounts.services import project_create
from experiments.config_policy import (
    CheckpointRefused,
    check_resume_checkpoint,
    preset_document,
    resolved_inputs,
)
from experiments.models import Experiment, Run, RunState
from experiments.path_policy import PathPolicy
from experiments.run_files import checkpoint_folder, run_folder
from experiments.services import run_create, run_transition
from launcher.placement import run_placement
from launcher.services import job_spec
from rl_engine.config import parse_config
from rl_engine.config.moved import MOVED
from rl_engine.jobspec import JobSpec, Placement
from tests.factories import ExperimentFactory, checkpoint_path, demo_config
from tests.platform.conftest import client_for
from tracking.services import checkpoint_record

MODEL_ROOT = Path(django_settings.MODEL_ROOTS[0])


def body(team, config) -> dict:
    return {"project": team["project"].pk, "name": "e", "config": config}


def with_(path: str, value) -> dict:
    cfg = demo_config()
    node = cfg
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return cfg


REFUSED = [
    ("model.path", "/etc"),
    ("model.path", str(MODEL_ROOT / ".." / ".." / "etc")),
    ("model.path", "../../../../../../etc"),
    ("model.tokenizer_path", "/root/.ssh"),
]


@pytest.mark.parametrize(("field", "value"), REFUSED)
def test_a_config_naming_a_path_outside_its_roots_is_a_400_naming_the_field(team, field, value):
    resp = client_for(team["member"]).post("/api/experiments", body(team, with_(field, value)), format="json")
    assert resp.status_code == 400, resp.json()
    messages = resp.json()["errors"][f"config.{field}"]
    assert str(MODEL_ROOT) in messages[0] and "MODEL_ROOTS" in messages[0]
    assert not Experiment.objects.exists()


MOVED_VALUES = {
    "trainer.checkpoint_dir": "/tmp/shared-checkpoints",
    "trainer.resume_from": "/etc/passwd",
    "pipeline.ray_address": "ray://attacker:10001",
    "logging.jsonl_path": "../escape.jsonl",
    "logging.progress_bar": False,
    "logging.mlflow.artifact_location": "file:///etc",
    "logging.wandb.dir": "/tmp/w",
}


@pytest.mark.parametrize("field", [f.path for f in MOVED])
def test_where_a_run_runs_is_not_the_configs_to_say(team, field):
    """The fields that moved to the placement are refused at their path, naming their new place; the
    value an old normalised export held for them (null; true for the progress bar) is dropped."""
    resp = client_for(team["member"]).post(
        "/api/experiments", body(team, with_(field, MOVED_VALUES[field])), format="json"
    )
    assert resp.status_code == 400, resp.json()
    assert resp.json()["errors"][f"config.{field}"] == [
        "moved out of the config: it says where a run runs (its placement), not what it trains; the platform "
        f"sets it for every run, the engine's CLI takes {next(f.flag for f in MOVED if f.path == field)}"
    ]
    old_default = next(f.old_default for f in MOVED if f.path == field)
    resp = client_for(team["member"]).post(
        "/api/experiments", body(team, with_(field, old_default)), format="json"
    )
    assert resp.status_code == 201, resp.json()
    section, *_, name = field.split(".")
    assert name not in str(Experiment.objects.get(pk=resp.json()["id"]).config[section])


def test_data_must_come_from_the_data_roots(team):
    outside = with_("data", {"source": "jsonl", "path": "/etc/shadow"})
    resp = client_for(team["member"]).post("/api/experiments", body(team, outside), format="json")
    assert resp.status_code == 400
    assert str(django_settings.DATA_ROOTS[0]) in resp.json()["errors"]["config.data.path"][0]
    inside = with_(
        "data", {"source": "jsonl", "path": str(Path(django_settings.DATA_ROOTS[0]) / "train.jsonl")}
    )
    assert (
        client_for(team["member"]).post("/api/experiments", body(team, inside), format="json").status_code
        == 201
    )


def test_paths_under_the_roots_and_allowed_model_names_are_accepted(team, settings):
    member = client_for(team["member"])
    assert member.post("/api/experiments", body(team, demo_config()), format="json").status_code == 201
    cfg = with_("logging", {"sinks": ["stdout", "jsonl"]})  # the launcher places the log in the run's folder
    assert member.post("/api/experiments", body(team, cfg), format="json").status_code == 201
    named = with_("model", {"path": "/models/Qwen2.5-1.5B-Instruct"})
    assert member.post("/api/experiments", body(team, named), format="json").status_code == 400
    settings.ALLOWED_MODELS = ["/models/Qwen2.5-1.5B-Instruct"]
    assert member.post("/api/experiments", body(team, named), format="json").status_code == 201


def test_relative_paths_count_from_the_engines_working_directory(team, settings):
    settings.ENGINE_WORKDIR = str(MODEL_ROOT.parent)
    member = client_for(team["member"])
    inside = with_("model.path", f"{MODEL_ROOT.name}/tiny")
    assert member.post("/api/experiments", body(team, inside), format="json").status_code == 201
    outside = with_("model.path", "tiny")  # the working directory itself is not a model root
    assert member.post("/api/experiments", body(team, outside), format="json").status_code == 400


def test_a_symlink_under_a_root_that_leads_outside_is_refused(team, tmp_path):
    MODEL_ROOT.mkdir(parents=True, exist_ok=True)
    link = MODEL_ROOT / f"escape-{os.getpid()}"
    link.symlink_to(tmp_path)
    try:
        resp = client_for(team["member"]).post(
            "/api/experiments", body(team, with_("model.path", str(link / "m"))), format="json"
        )
        assert resp.status_code == 400 and "config.model.path" in resp.json()["errors"]
    finally:
        link.unlink()


def test_update_and_yaml_import_are_held_to_the_same_policy(team):
    member = client_for(team["member"])
    exp = member.post("/api/experiments", body(team, demo_config()), format="json").json()
    resp = member.patch(
        f"/api/experiments/{exp['id']}", {"config": with_("model.path", "/etc")}, format="json"
    )
    assert resp.status_code == 400 and "config.model.path" in resp.json()["errors"]
    assert Experiment.objects.get(pk=exp["id"]).config["model"]["path"] != "/etc"
    yaml_text = "model:\n  path: /etc\n  tiny: {}\n"
    imported = member.post(
        "/api/experiments/import",
        {"project": team["project"].pk, "name": "y", "yaml": yaml_text},
        format="json",
    )
    assert imported.status_code == 400 and "yaml.model.path" in imported.json()["errors"]


def test_launch_checks_a_config_stored_before_the_policy(team):
    cfg = parse_config(with_("model.path", "/etc")).model_dump(mode="json")
    old = ExperimentFactory(project=team["project"], config=cfg)  # written directly, as an old row would be
    resp = client_for(team["member"]).post("/api/runs", {"experiment": old.pk}, format="json")
    assert resp.status_code == 400 and "config.model.path" in resp.json()["errors"]
    assert not Run.objects.exists()


def test_trust_remote_code_needs_the_projects_permission_set_by_an_administrator(team):
    owner = client_for(team["owner"])
    cfg = with_("model.trust_remote_code", True)
    resp = owner.post("/api/experiments", body(team, cfg), format="json")
    assert (
        resp.status_code == 400
        and "administrator" in resp.json()["errors"]["config.model.trust_remote_code"][0]
    )
    project_url = f"/api/projects/{team['project'].pk}"
    assert owner.get(project_url).json()["allow_trust_remote_code"] is False
    owner.patch(project_url, {"allow_trust_remote_code": True}, format="json")  # an owner cannot grant it
    assert owner.get(project_url).json()["allow_trust_remote_code"] is False
    team["project"].allow_trust_remote_code = True  # what the admin does
    team["project"].save()
    assert owner.get(project_url).json()["allow_trust_remote_code"] is True
    assert owner.post("/api/experiments", body(team, cfg), format="json").status_code == 201


def test_the_admin_sets_the_trust_remote_code_flag(team, admin_client):
    project = team["project"]
    form = {"name": project.name, "description": "", "allow_trust_remote_code": "on"}
    inline = {"memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"}
    resp = admin_client.post(f"/admin/accounts/project/{project.pk}/change/", {**form, **inline})
    assert resp.status_code == 302, resp.content[:500]
    project.refresh_from_db()
    assert project.allow_trust_remote_code is True


def test_resume_only_from_a_checkpoint_in_the_runs_own_folder(team, experiment):
    member = client_for(team["member"])
    run = run_create(experiment=experiment, user=team["member"])
    run_transition(run_id=run.pk, to=RunState.FAILED, error="x")
    checkpoint_record(run_id=run.pk, step=5, path="/etc/cron.d/evil")  # e.g. a member posting events
    resp = member.post(f"/api/runs/{run.pk}/resume", {}, format="json")
    assert resp.status_code == 400 and "resumed_from_checkpoint" in resp.json()["errors"]
    good = checkpoint_record(run_id=run.pk, step=6, path=checkpoint_path(run, 6))
    resp = member.post(f"/api/runs/{run.pk}/resume", {}, format="json")
    assert resp.status_code == 201 and resp.json()["resumed_from_checkpoint"] == good.pk
    resumed = Run.objects.get(pk=resp.json()["id"])
    assert resp.json()["config"] == run.config  # the same config: where it resumes from is not in it
    assert job_spec(resumed, run_folder(resumed) / "token").placement.resume_from == good.path


def test_a_checkpoint_of_another_projects_run_is_refused(team):
    foreign = ExperimentFactory(project=project_create(name="gamma", user=team["stranger"]))
    foreign_run = run_create(experiment=foreign, user=team["stranger"])
    ckpt = checkpoint_record(run_id=foreign_run.pk, step=1, path=checkpoint_path(foreign_run, 1))
    with pytest.raises(CheckpointRefused, match="of this project"):
        check_resume_checkpoint(ckpt, project=team["project"])
    check_resume_checkpoint(ckpt, project=foreign.project)  # its own project: fine


def test_the_launcher_places_every_run_in_its_own_folder_and_leaves_the_config_alone(team, experiment):
    run = run_create(experiment=experiment, user=None)
    spec = job_spec(run, run_folder(run) / "token")
    assert spec.config.model_dump(mode="json") == run.config  # what to train: the user's, untouched
    assert spec.placement.checkpoint_dir == str(checkpoint_folder(run))
    assert spec.placement.run_dir == str(run_folder(run)) and spec.placement.resume_from is None
    assert spec.placement.ray_address is None  # a run joins the cluster it was submitted to
    assert spec.placement.jsonl_file() == str(run_folder(run) / "metrics.jsonl")
    assert spec.placement.sinks == ("http",) and spec.placement.progress_bar is False


def test_two_runs_of_the_gsm8k_preset_checkpoint_into_different_folders(team, settings):
    settings.MODEL_ROOTS = ["/models"]
    settings.DATA_ROOTS = ["/data"]
    preset = preset_document("gsm8k-qwen2.5-1.5b-vllm")
    assert "checkpoint_dir" not in preset["trainer"]  # the engine preset names no shared folder
    exp = client_for(team["member"]).post("/api/experiments", body(team, preset), format="json")
    assert exp.status_code == 201, exp.json()
    runs = [run_create(experiment=Experiment.objects.get(pk=exp.json()["id"]), user=None) for _ in range(2)]
    folders = {run_placement(r, parse_config(r.config)).checkpoint_dir for r in runs}
    assert len(folders) == 2


def test_the_served_presets_build_their_tiny_model_under_a_model_root(team):
    preset = client_for(team["member"]).get("/api/presets/demo-cpu").json()
    assert Path(preset["model"]["path"]).parent == MODEL_ROOT
    assert client_for(team["member"]).get("/api/presets").json()["demo-cpu"] == preset
    assert (
        client_for(team["member"]).post("/api/experiments", body(team, preset), format="json").status_code
        == 201
    )


def test_the_engines_own_cli_is_not_bound_by_the_platforms_policy():
    cfg = parse_config(with_("model", {"path": "/anywhere/model", "trust_remote_code": True}))
    spec = JobSpec(config=cfg, placement=Placement(checkpoint_dir="/tmp/ck", ray_address="auto"))
    assert (spec.placement.checkpoint_dir, spec.run_config().model.path) == ("/tmp/ck", "/anywhere/model")


# --- data (source: dataset / jsonl), trackers ------------------------------------------------------------

DATA_ROOT = Path(django_settings.DATA_ROOTS[0])


def dataset(**fields) -> dict:
    spec = {"source": "dataset", "path": str(DATA_ROOT / "gsm"), "columns": {"prompt": "question"}}
    return with_("data", fields if fields.get("source") == "jsonl" else {**spec, **fields})


def post(team, cfg):
    return client_for(team["member"]).post("/api/experiments", body(team, cfg), format="json")


def refused(team, cfg, field: str) -> str:
    before = Experiment.objects.count()
    resp = post(team, cfg)
    assert resp.status_code == 400, resp.json()
    assert Experiment.objects.count() == before
    return resp.json()["errors"][f"config.{field}"][0]


DATA_REFUSED = [
    (
        "data.validation_path",
        {"source": "jsonl", "path": str(DATA_ROOT / "t.jsonl"), "validation_path": "/etc/shadow"},
    ),
    ("data.path", {"path": "/etc"}),
    ("data.path", {"path": "../../../../etc/*.conf"}),
    ("data.path", {"path": f"{DATA_ROOT}/x/**/../../../secret.parquet"}),
    ("data.path", {"path": "var/runs/rlp-run-1"}),  # a folder of the working directory, not a hub id
    ("data.path", {"path": "json"}),  # a datasets builder name: it would read the working directory's files
    ("data.path", {"path": "hf://buckets/org/name"}),
    ("data.path", {"path": "hf://datasets/org/name/../../x"}),
    ("data.validation_path", {"validation_path": "/srv/other-project/test.parquet"}),
    ("data.cache_dir", {"cache_dir": "/tmp/hf-cache"}),
    ("data.synthetic", {"path": "someone/dataset", "synthetic": {"train_size": 4}}),
]


@pytest.mark.parametrize(("field", "data"), DATA_REFUSED)
def test_data_fields_read_only_under_the_data_roots_or_a_hub_id(team, field, data):
    message = refused(team, dataset(**data), field)
    assert str(DATA_ROOT) in message and "DATA_ROOTS" in message


def test_hub_dataset_ids_are_allowed_as_the_setting_says(team, settings):
    for path in ("openai/gsm8k", "hf://datasets/openai/gsm8k"):
        assert post(team, dataset(path=path, validation_path="openai/gsm8k")).status_code == 201
    settings.ALLOWED_DATASETS = ["openai/*"]
    assert "ALLOWED_DATASETS" in refused(team, dataset(path="someone/dump"), "data.path")
    assert post(team, dataset(path="openai/gsm8k")).status_code == 201


def test_data_under_the_roots_is_accepted(team):
    cfg = dataset(path=f"{DATA_ROOT}/gsm/*.parquet", cache_dir=str(DATA_ROOT / "cache"), synthetic=None)
    assert post(team, cfg).status_code == 201
    generated = dataset(path=str(DATA_ROOT / "generated"), synthetic={"train_size": 4})
    assert post(team, generated).status_code == 201


def test_downloads_are_allowed_unless_an_administrator_turns_them_off(team, settings):
    assert post(team, dataset(path="openai/gsm8k", allow_download=True)).status_code == 201
    settings.ALLOW_DATASET_DOWNLOADS = False
    assert "ALLOW_DATASET_DOWNLOADS" in refused(team, dataset(allow_download=True), "data.allow_download")
    assert post(team, dataset(allow_download=False)).status_code == 201


MLFLOW_REFUSED = [
    "sqlite:////etc/cron.d/x.db",
    "sqlite:///../../x.db",
    "file:///tmp/mlruns",
    "./mlruns",
    "postgresql://postgres@127.0.0.1:5432/rlplatform",
    "databricks",
    "http://mlflow.example.com",  # no server is allowed by default
]


@pytest.mark.parametrize("uri", MLFLOW_REFUSED)
def test_mlflow_writes_only_to_the_runs_folder_or_an_allowed_server(team, uri):
    message = refused(team, with_("logging.mlflow", {"tracking_uri": uri}), "logging.mlflow.tracking_uri")
    assert "ALLOWED_MLFLOW_SERVERS" in message and "run's own folder" in message


def test_allowed_mlflow_servers_match_scheme_host_port_and_path(team, settings):
    settings.ALLOWED_MLFLOW_SERVERS = ["http://mlflow:5000", "https://ml.example.com/team-a"]
    for uri in (
        "sqlite:///mlflow.db",
        "http://mlflow:5000",
        "http://MLflow:5000/",
        "https://ml.example.com/team-a/x",
    ):
        assert post(team, with_("logging.mlflow", {"tracking_uri": uri})).status_code == 201, uri
    for uri in ("http://mlflow:5001", "https://mlflow:5000", "http://mlflow:5000@evil.example",
                "https://ml.example.com/team-b", "https://ml.example.com/team-a/../team-b"):  # fmt: skip
        refused(team, with_("logging.mlflow", {"tracking_uri": uri}), "logging.mlflow.tracking_uri")
    settings.ALLOWED_MLFLOW_SERVERS = ["*"]
    assert post(team, with_("logging.mlflow", {"tracking_uri": "https://anywhere:8443"})).status_code == 201
    refused(team, with_("logging.mlflow", {"tracking_uri": "file:///tmp/x"}), "logging.mlflow.tracking_uri")


@pytest.mark.parametrize(
    "uri",
    [
        "http://EVIL\\@mlflow:5000",  # urlsplit: host mlflow; MLflow's HTTP client: host EVIL
        "http://evil.example\\@mlflow:5000/",
        "http://mlflow:5000\\@evil.example",
        "https://ml.example.com/team-a/%2e%2e/team-b",  # encoded dot segments escape the path prefix
        "https://ml.example.com/team-a/%2E%2E/team-b",
        "https://ml.example.com/team-a/x%2f..%2f..%2fteam-b",
        "https://ml.example.com/team-a/./../team-b",
        "http://mlflow:5000/\x00",
        "http://mlflow:5000\r\n",
        "http://mlflow:5000#@evil.example",
        "http://2130706433:5000",
    ],
)
def test_allowed_mlflow_servers_are_not_bypassed_by_parser_differences(team, settings, uri):
    settings.ALLOWED_MLFLOW_SERVERS = ["http://mlflow:5000", "https://ml.example.com/team-a"]
    message = refused(team, with_("logging.mlflow", {"tracking_uri": uri}), "logging.mlflow.tracking_uri")
    assert "must not" in message or "invalid" in message or "segment" in message or "ASCII" in message
    settings.ALLOWED_MLFLOW_SERVERS = ["*"]  # any server, but still only one the strict parser reads
    refused(team, with_("logging.mlflow", {"tracking_uri": uri}), "logging.mlflow.tracking_uri")


def test_an_allow_list_entry_the_strict_parser_refuses_allows_nothing(team, settings):
    settings.ALLOWED_MLFLOW_SERVERS = ["https://ml.example.com/team-a/%2e%2e", "http://u@mlflow:5000"]
    for uri in ("https://ml.example.com/team-a/x", "http://mlflow:5000"):
        refused(team, with_("logging.mlflow", {"tracking_uri": uri}), "logging.mlflow.tracking_uri")


def test_a_remote_reward_posts_only_to_a_service_the_operator_lists(team, settings):
    def http(url: str) -> dict:
        return {"name": "http", "kwargs": {"url": url, "batch_size": 16}}

    settings.ALLOWED_REWARD_SERVICES = []
    message = refused(
        team, with_("reward", http("http://grader:8808/score/math_verify")), "reward.kwargs.url"
    )
    assert "ALLOWED_REWARD_SERVICES" in message and "none" in message
    settings.ALLOWED_REWARD_SERVICES = ["http://grader:8808/score", "https://judge.example.com/v1"]
    for url in ("http://grader:8808/score/math_verify", "https://judge.example.com/v1"):
        assert post(team, with_("reward", http(url))).status_code == 201, url
    for url in (
        "http://grader:8809/score/x",  # another port
        "http://grader:8808/admin",  # outside the listed path
        "https://grader:8808/score/x",  # another scheme
        "http://169.254.169.254/score",  # the metadata service: not listed
    ):
        refused(team, with_("reward", http(url)), "reward.kwargs.url")
    combined = {"combine": [{"name": "contains"}, {**http("http://evil.example/score"), "weight": 0.5}]}
    refused(team, with_("reward", combined), "reward.combine[1].kwargs.url")
    # a URL the strict parser refuses is the engine's own field error, whatever the list says
    settings.ALLOWED_REWARD_SERVICES = ["*"]
    refused(team, with_("reward", http("http://grader:8808@evil.example/x")), "reward.kwargs")
    assert post(team, with_("reward", http("http://anywhere:9000/grade"))).status_code == 201


def test_a_reward_model_is_a_model_the_platform_allows_within_the_runs_bounds(team, settings):
    def rm(**kwargs) -> dict:
        return {"name": "model", "kwargs": {"path": str(MODEL_ROOT / "judge"), **kwargs}}

    assert post(team, with_("reward", rm())).status_code == 201
    for path in ("/etc", str(MODEL_ROOT / ".." / ".." / "etc")):
        message = refused(team, with_("reward", rm(path=path)), "reward.kwargs.path")
        assert "MODEL_ROOTS" in message
    settings.RUN_MAX_GPUS = 1
    refused(team, with_("reward", rm(num_gpus=2)), "reward.kwargs.num_gpus")
    combined = {"combine": [{"name": "contains"}, {**rm(path="/root"), "weight": 0.5}]}
    refused(team, with_("reward", combined), "reward.combine[1].kwargs.path")


def test_the_job_reads_the_checked_paths_and_its_trackers_write_into_its_folder(team, experiment, settings):
    settings.ENGINE_WORKDIR = str(DATA_ROOT.parent)
    raw = dataset(path=f"{DATA_ROOT.name}/x/../gsm", validation_path="var/runs", cache_dir=None)
    raw["logging"] = {"sinks": ["stdout", "mlflow", "wandb"], "mlflow": {"tracking_uri": "sqlite:///team.db"}}
    raw["model"]["path"] = f"{MODEL_ROOT.relative_to(DATA_ROOT.parent)}/tiny"
    cfg = parse_config(raw)
    run = run_create(experiment=experiment, user=None, config=cfg)
    folder = run_folder(run)
    placement = run_placement(run, cfg)
    spec = JobSpec(config=cfg, placement=placement).run_config()
    # model.tiny builds in the project's own folder (tests/platform/test_trust_boundary_paths.py)
    assert spec.model.path == str(MODEL_ROOT / "projects" / f"project-{team['project'].pk}" / "tiny")
    assert spec.data.path == str(DATA_ROOT / "gsm")  # absolute, as checked
    assert spec.data.validation_path == "hf://datasets/var/runs"  # the hub's, never a local folder
    assert cfg.data.path == f"{DATA_ROOT.name}/x/../gsm"  # the user's config is not edited
    assert placement.mlflow_store("sqlite:///team.db") == (
        f"sqlite:///{folder}/team.db",
        str(folder / "mlflow-artifacts"),
    )
    assert placement.wandb_folder() == str(folder / "wandb")
    # the default: a store in the run's folder too; a server keeps its own artifact root
    assert placement.mlflow_store(None)[0] == f"sqlite:///{folder}/mlflow.db"
    assert placement.mlflow_store("http://mlflow:5000") == ("http://mlflow:5000", None)
    # nothing to resolve: an allowed model by name, a built-in task
    plain = parse_config({"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}})
    settings.ALLOWED_MODELS = ["Qwen/Qwen2.5-0.5B-Instruct"]
    assert (
        resolved_inputs(plain, team["project"].pk, PathPolicy.from_settings()).model_dump(
            exclude_defaults=True
        )
        == {}
    )


def test_a_run_is_placed_where_its_inputs_were_resolved_when_it_was_created(team, experiment, settings):
    """The launcher reads the inputs run_create stored (one resolution per run): a queued run keeps them
    when the engine's working directory changes before it starts. A row from before they were stored
    (``inputs`` null) is resolved at launch by the same function."""
    settings.ENGINE_WORKDIR = str(DATA_ROOT.parent)
    raw = dataset(path=f"{DATA_ROOT.name}/gsm", validation_path=None, cache_dir=None)
    cfg = parse_config(raw)
    run = run_create(experiment=experiment, user=None, config=cfg)
    stored = Run.objects.get(pk=run.pk)
    assert stored.inputs["data_path"] == str(DATA_ROOT / "gsm")
    settings.ENGINE_WORKDIR = str(DATA_ROOT)  # the relative path would now resolve elsewhere
    assert run_placement(stored, cfg).inputs.data_path == str(DATA_ROOT / "gsm")
    Run.objects.filter(pk=run.pk).update(inputs=None)
    old_row = Run.objects.get(pk=run.pk)
    assert run_placement(old_row, cfg).inputs.data_path == str(DATA_ROOT / DATA_ROOT.name / "gsm")


def test_the_served_dataset_preset_generates_its_data_under_a_data_root(team):
    preset = client_for(team["member"]).get("/api/presets/gsm8k-style-tiny-cpu").json()
    assert Path(preset["data"]["path"]).parent == DATA_ROOT and preset["data"]["synthetic"]
    assert Path(preset["model"]["path"]).parent == MODEL_ROOT
    assert post(team, preset).status_code == 201

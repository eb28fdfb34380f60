"""Paths a config names, checked by what they really read and where they really write (docs/api.md,
"Trust boundary"): a data glob or folder is expanded and walked, and a link inside a data root that
leads out is refused even when not named; a model ``model.tiny`` builds (and a dataset
``data.synthetic`` generates) goes into the project's own folder, never to a name other projects load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from experiments.models import Experiment
from experiments.services import run_create
from launcher import services
from tests.counting_server import counting_server
from tests.factories import demo_config
from tests.platform.conftest import client_for

ALLOWED = "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.fixture
def roots(settings, tmp_path):
    """A model root, a data root and an engine working directory of this test's own, and files outside."""
    made = {name: tmp_path / name for name in ("models", "data", "workdir", "outside")}
    for path in made.values():
        path.mkdir()
    settings.MODEL_ROOTS, settings.DATA_ROOTS = [made["models"]], [made["data"]]
    settings.ENGINE_WORKDIR, settings.VAR_DIR = str(made["workdir"]), tmp_path / "var"
    settings.ALLOWED_MODELS = [ALLOWED]
    (made["outside"] / "secret.csv").write_text("question,answer\nthe other project's,1\n")
    return made


def _dataset_config(path: str, **extra) -> dict:
    cfg = demo_config()
    cfg["data"] = {"source": "dataset", "path": path, "columns": {"prompt": "question"}, **extra}
    return cfg


def _post(team, cfg):
    return client_for(team["member"]).post(
        "/api/experiments", {"project": team["project"].pk, "name": "e", "config": cfg}, format="json"
    )


@pytest.mark.parametrize("named", ["glob", "recursive glob", "folder", "folder with a trailing slash"])
@pytest.mark.parametrize("link", ["file", "folder"])
def test_a_link_inside_the_data_root_is_refused_through_a_glob_or_its_folder(team, roots, named, link):
    data = roots["data"] / "set"
    (data / "sub").mkdir(parents=True)
    (data / "train.csv").write_text("question,answer\nmine,2\n")
    if link == "file":
        (data / "sub" / "leak.csv").symlink_to(roots["outside"] / "secret.csv")
    else:
        (data / "sub" / "elsewhere").symlink_to(roots["outside"], target_is_directory=True)
    value = {"glob": f"{data}/sub/*", "recursive glob": f"{data}/**/*.csv", "folder": str(data),
             "folder with a trailing slash": f"{data}/"}[named]  # fmt: skip
    resp = _post(team, _dataset_config(value))
    assert resp.status_code == 400, resp.json()
    message = resp.json()["errors"]["config.data.path"][0]
    assert "real path" in message and "DATA_ROOTS" in message and str(data / "sub") in message
    assert not Experiment.objects.exists()


def test_links_that_stay_inside_the_data_root_are_fine(team, roots):
    shared = roots["data"] / "shared"
    shared.mkdir()
    (shared / "train.csv").write_text("question,answer\nq,1\n")
    data = roots["data"] / "set"
    data.mkdir()
    (data / "train.csv").symlink_to(shared / "train.csv")
    (data / "more").symlink_to(shared, target_is_directory=True)
    (data / "loop").symlink_to(data, target_is_directory=True)  # a cycle ends the walk, not the check
    for value in (f"{data}/*.csv", str(data), f"{data}/**/*.csv"):
        assert _post(team, _dataset_config(value)).status_code == 201, value


def test_a_jsonl_validation_file_is_checked_by_real_path_too(team, roots):
    (roots["data"] / "train.jsonl").write_text('{"prompt": "p", "answer": "1"}\n')
    os.symlink(roots["outside"] / "secret.csv", roots["data"] / "val.jsonl")
    cfg = demo_config()
    cfg["data"] = {"source": "jsonl", "path": str(roots["data"] / "train.jsonl"),
                   "validation_path": str(roots["data"] / "val.jsonl")}  # fmt: skip
    resp = _post(team, cfg)
    assert resp.status_code == 400 and "config.data.validation_path" in resp.json()["errors"]


def _job_config(team, cfg, tmp_path) -> dict:
    """The config the job runs: the user's, its inputs read where the launcher's placement says."""
    resp = _post(team, cfg)
    assert resp.status_code == 201, resp.json()
    run = run_create(experiment=Experiment.objects.get(pk=resp.json()["id"]), user=team["member"])
    return services.job_spec(run, tmp_path / "token").run_config().model_dump(mode="json")


def test_a_tiny_model_named_like_an_allowed_model_is_built_in_the_projects_own_folder(team, roots, tmp_path):
    """The hole: ``model.tiny`` with ``model.path`` = an allowed model name built random weights at
    ``<ENGINE_WORKDIR>/<that name>``, which every other project naming the model then loaded."""
    cfg = demo_config()
    cfg["model"]["path"] = ALLOWED
    model = _job_config(team, cfg, tmp_path)["model"]
    built = Path(model["path"])
    assert built == roots["models"] / "projects" / f"project-{team['project'].pk}" / "Qwen2.5-0.5B-Instruct"
    assert not built.is_relative_to(roots["workdir"]) and model["tiny"] is not None
    # a shared name under the model root is not claimed either
    cfg["model"]["path"] = str(roots["models"] / "llama-3-8b")
    assert Path(_job_config(team, cfg, tmp_path)["model"]["path"]).parent == built.parent
    # without tiny an allowed model is loaded by its name, as before
    cfg["model"] = {"path": ALLOWED}
    assert _job_config(team, cfg, tmp_path)["model"]["path"] == ALLOWED


def test_a_synthetic_dataset_is_generated_in_the_projects_own_folder(team, roots, tmp_path):
    cfg = _dataset_config(str(roots["data"] / "gsm8k"), synthetic={"train_size": 8, "test_size": 2})
    cfg["data"]["columns"] = {"prompt": "question", "answer": "answer"}
    data = _job_config(team, cfg, tmp_path)["data"]
    assert Path(data["path"]) == roots["data"] / "projects" / f"project-{team['project'].pk}" / "gsm8k"


@pytest.mark.parametrize("section", ["model", "data"])
def test_building_needs_a_root_and_a_plain_folder_name(team, roots, settings, section):
    cfg = demo_config()
    if section == "data":
        cfg = _dataset_config(str(roots["data"] / "my set"), synthetic={"train_size": 8})
        field = "config.data.synthetic"
    else:
        cfg["model"]["path"] = str(roots["models"]) + "/.."
        field = "config.model.tiny"
    resp = _post(team, cfg)
    assert resp.status_code == 400 and "folder name" in resp.json()["errors"][field][0], resp.json()
    settings.MODEL_ROOTS = settings.DATA_ROOTS = []
    resp = _post(team, demo_config())
    assert resp.status_code == 400 and "none is configured" in resp.json()["errors"]["config.model.tiny"][0]


def _card(folder: Path, yaml_text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(f"---\n{yaml_text.strip()}\n---\n# a dataset\n")


@pytest.mark.parametrize("field", ["path", "validation_path"])
@pytest.mark.parametrize("kind", ["dotdot", "absolute", "glob", "data_dir", "url"])
def test_a_dataset_card_that_reads_outside_or_fetches_a_url_is_refused_at_create(team, roots, field, kind):
    """No symlink involved: the card itself names the outside file (or a URL). The policy resolves the
    folder as the engine will (rl_engine/dataset_folder.py); the internal service gets no request."""
    good = roots["data"] / "good"
    (good / "train.csv").parent.mkdir()
    (good / "train.csv").write_text("question,answer\nmine,1\n")
    data = roots["data"] / "set"
    (data / "train.csv").parent.mkdir()
    (data / "train.csv").write_text("question,answer\nmine,1\n")
    with counting_server() as server:
        files = {"dotdot": "../../outside/secret.csv", "absolute": str(roots["outside"] / "secret.csv"),
                 "glob": "../../**/*.csv", "url": f"{server.url}/x.csv"}  # fmt: skip
        if kind == "data_dir":
            _card(data, "configs:\n- config_name: default\n  data_dir: ../../outside")
        else:
            _card(
                data,
                f"configs:\n- config_name: default\n  data_files:\n  - split: train\n    path: {files[kind]}",
            )
        paths = {"path": str(good), "validation_path": str(data)} if field == "validation_path" else {
            "path": str(data)}  # fmt: skip
        resp = _post(team, _dataset_config(**paths))
        assert server.requests == 0
    assert resp.status_code == 400, resp.json()
    [message] = resp.json()["errors"][f"config.data.{field}"]
    assert f"{data}/README.md config 'default'" in message
    expected = "a URL in a dataset card is not followed" if kind == "url" else "leaves the data roots"
    assert expected in message and "\n" not in message
    assert not Experiment.objects.exists()


def test_a_dataset_card_that_stays_inside_the_roots_is_accepted(team, roots):
    shared = roots["data"] / "shared"
    shared.mkdir()
    (shared / "train.csv").write_text("question,answer\nq,1\n")
    data = roots["data"] / "set"
    _card(data, "configs:\n- config_name: main\n  data_files: ../shared/*.csv\n- config_name: other\n"
                "  data_files: https://example.com/x.csv")  # fmt: skip
    assert _post(team, _dataset_config(str(data), name="main")).status_code == 201
    resp = _post(team, _dataset_config(str(data), name="other"))
    assert resp.status_code == 400 and "URL" in resp.json()["errors"]["config.data.path"][0]

"""``GET /api/models`` and the form's schema read files the platform did not write: a model folder's
files linked out of the root, FIFOs, nested deeper than a parser recurses, a card JSON cannot hold; and a
data folder's card or manifest nested deep at ``POST /api/experiments``. Each is a model shown as
unreadable, or a 400 naming the file: never a hang, a 500 or a file outside the roots served. The answer
gives absolute server paths only to a member of some project (the picker's values)."""

from __future__ import annotations

import json
import os

import pytest

from experiments.models import Experiment
from tests.factories import UserFactory, demo_config
from tests.platform.conftest import client_for
from tests.platform.test_model_catalogue import listed, roots, write_model  # noqa: F401 (a fixture)

SECRET = "the-other-projects-secret"
DEEP = 100_000


def test_a_card_or_config_linked_out_of_the_root_is_not_served(team, roots, tmp_path):  # noqa: F811
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "card.md").write_text(f"---\nlicense: {SECRET}\n---\n")
    (outside / "tokenizer_config.json").write_text(json.dumps({"chat_template": SECRET}))
    write_model(roots[0] / "m", chat=False)
    (roots[0] / "m" / "README.md").symlink_to(outside / "card.md")
    (roots[0] / "m" / "tokenizer_config.json").symlink_to(outside / "tokenizer_config.json")
    resp = client_for(team["member"]).get("/api/models")
    assert resp.status_code == 200 and SECRET.encode() not in resp.content
    (model,) = resp.json()["models"]
    assert model["card"] == {} and model["chat_template"] is False
    assert sorted(p.split(":")[0] for p in model["unreadable"]) == ["README.md", "tokenizer_config.json"]


@pytest.mark.timeout(20)
def test_fifos_among_a_models_files_do_not_hang_the_request(team, roots):  # noqa: F811
    write_model(roots[0] / "m", chat=False)  # tokenizer_config.json is read for the chat template
    shard = next((roots[0] / "m").glob("*.safetensors"))
    shard.unlink()
    for name in (shard.name, "README.md", "tokenizer_config.json"):
        os.mkfifo(roots[0] / "m" / name)
    write_model(roots[0] / "n")
    (roots[0] / "n" / "config.json").unlink()
    os.mkfifo(roots[0] / "n" / "config.json")  # no regular config.json: not a model directory
    (model,) = listed(team["member"])["models"]
    assert model["name"] == "m" and model["parameters"] is None
    assert all("not a regular file" in p for p in model["unreadable"]) and len(model["unreadable"]) == 3


@pytest.mark.timeout(60)
def test_hostile_files_make_a_model_unreadable_not_a_500_here_or_in_the_form(team, roots):  # noqa: F811
    cards = {
        "deep-card": "---\nx: " + "[" * DEEP + "]" * DEEP + "\n---\n",
        "number-key": "---\n1: one\n---\n",
        "binary": "---\nx: !!binary /w==\n---\n",
        "bomb": "---\na: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
        "c: [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n---\n",
    }
    for name, card in cards.items():
        write_model(roots[0] / name)
        (roots[0] / name / "README.md").write_text(card)
    write_model(roots[0] / "deep-config")
    (roots[0] / "deep-config" / "config.json").write_text('{"a": ' * DEEP + "1" + "}" * DEEP)
    write_model(roots[0] / "dated")
    (roots[0] / "dated" / "README.md").write_text("---\n2024-01-01: released\nwhen: 2024-02-02\n---\n")
    by_name = {m["name"]: m for m in listed(team["member"])["models"]}
    assert set(by_name) == {*cards, "deep-config", "dated"}
    for name in (*cards, "deep-config"):
        assert by_name[name]["unreadable"], name
    assert by_name["dated"]["card"] == {"2024-01-01": "released", "when": "2024-02-02"}
    resp = client_for(team["member"]).get("/api/schema/experiment", {"project": team["project"].pk})
    assert resp.status_code == 200


def test_absolute_paths_only_to_a_member_of_some_project(db, team, roots, settings, tmp_path):  # noqa: F811
    write_model(roots[0] / "org" / "a")
    write_model(tmp_path / "shared" / "b")
    settings.ALLOWED_MODELS = [str(tmp_path / "shared" / "b")]
    loner = UserFactory(username="loner")  # signed in, in no project
    resp = client_for(loner).get("/api/models")
    assert resp.status_code == 200 and str(tmp_path).encode() not in resp.content
    assert [m["path"] for m in resp.json()["models"]] == ["models/org/a", "b"]
    # A member gets the value model.path takes, what the form's picker offers (tests/e2e/test_model_picker)
    member = [m["path"] for m in listed(team["viewer"])["models"]]
    assert member == [str(roots[0] / "org" / "a"), str(tmp_path / "shared" / "b")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["README.md", ".huggingface.yaml", "dataset_dict.json"])
def test_a_data_folder_nested_deep_is_a_400_at_create(team, settings, tmp_path, name):
    settings.DATA_ROOTS = [tmp_path / "data"]
    folder = tmp_path / "data" / "set"
    folder.mkdir(parents=True)
    (folder / "train.csv").write_text("question,answer\nq,1\n")
    deep = "[" * DEEP + "]" * DEEP
    text = {"README.md": f"---\nx: {deep}\n---\n", ".huggingface.yaml": f"x: {deep}\n"}.get(name, deep)
    (folder / name).write_text(text)
    cfg = demo_config()
    cfg["data"] = {"source": "dataset", "path": str(folder), "columns": {"prompt": "question"}}
    resp = client_for(team["member"]).post(
        "/api/experiments", {"project": team["project"].pk, "name": "e", "config": cfg}, format="json"
    )
    assert resp.status_code == 400, resp.content[:500]
    [message] = resp.json()["errors"]["config.data.path"]
    assert f"{folder / name}: " in message and "nested deeper" in message
    assert not Experiment.objects.exists()

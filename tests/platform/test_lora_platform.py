"""LoRA on the platform: ``model.lora`` in the form's schema and the API, bad values refused with a 400
naming the field, and the run page saying what the run trains ("LoRA r=..." beside the model)."""

from __future__ import annotations

import pytest
from django.test import Client

from experiments.models import Experiment
from experiments.services import run_create
from tests.factories import demo_config
from tests.platform.conftest import client_for


def post(team, config: dict):
    body = {"project": team["project"].pk, "name": "lora", "config": config}
    return client_for(team["member"]).post("/api/experiments", body, format="json")


def with_lora(lora: dict) -> dict:
    cfg = demo_config()
    cfg["model"]["lora"] = lora
    return cfg


def test_the_form_offers_lora_with_the_model(team):
    schema = client_for(team["member"]).get(f"/api/schema/experiment?project={team['project'].pk}").json()
    lora = schema["$defs"]["LoraConfig"]["properties"]
    assert {"rank", "alpha", "dropout", "target_modules"} <= set(lora)
    assert lora["rank"]["default"] == 16 and lora["dropout"]["default"] == 0.0


@pytest.mark.parametrize(
    "lora, field",
    [
        ({"rank": 0}, "model.lora.rank"),
        ({"alpha": -1}, "model.lora.alpha"),
        ({"dropout": 1.5}, "model.lora.dropout"),
        ({"target_modules": []}, "model.lora.target_modules"),
        ({"target_modules": ["q_proj; rm -rf"]}, "model.lora.target_modules"),
        ({"rank": 8, "rnk": 8}, "model.lora.rnk"),
    ],
)
def test_bad_lora_values_are_400s_naming_the_field(team, lora, field):
    before = Experiment.objects.count()
    resp = post(team, with_lora(lora))
    assert resp.status_code == 400, resp.json()
    assert f"config.{field}" in resp.json()["errors"], resp.json()
    assert Experiment.objects.count() == before


def test_the_run_page_says_lora_beside_the_model(team):
    resp = post(team, with_lora({"rank": 8, "alpha": 16}))
    assert resp.status_code == 201, resp.json()
    experiment = Experiment.objects.get(pk=resp.json()["id"])
    run = run_create(experiment=experiment, user=team["member"])
    browser = Client()
    browser.force_login(team["member"])
    page = browser.get(f"/runs/{run.pk}/").content.decode()
    model = demo_config()["model"]["path"].rstrip("/").rsplit("/", 1)[-1]
    assert f"model <b>{model} · LoRA r=8, alpha=16</b>" in page
    full = run_create(
        experiment=Experiment.objects.get(pk=post(team, demo_config()).json()["id"]), user=team["member"]
    )
    page = browser.get(f"/runs/{full.pk}/").content.decode()
    assert f"model <b>{model}</b>" in page and "LoRA" not in page


def test_target_modules_the_model_folder_lacks_are_a_400_at_create(team, settings, tmp_path):
    """Read from the folder's safetensors headers (no torch in the web process): a typo is a 400 naming
    model.lora.target_modules, not a job that fails at start."""
    from rl_engine.config import TinyModelSpec
    from rl_engine.models.tiny import save_tiny_model

    folder = save_tiny_model(TinyModelSpec(seed=0), tmp_path / "tiny")
    settings.MODEL_ROOTS = [tmp_path]
    cfg = demo_config()
    cfg["model"] = {"path": str(folder), "lora": {"target_modules": ["q_proj", "wq"]}}
    resp = post(team, cfg)
    assert resp.status_code == 400, resp.json()
    [message] = resp.json()["errors"]["config.model.lora.target_modules"]
    assert "'wq'" in message and "q_proj" in message
    cfg["model"]["lora"]["target_modules"] = ["q_proj", "v_proj"]
    assert post(team, cfg).status_code == 201

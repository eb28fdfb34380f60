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

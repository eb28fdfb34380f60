"""The new-experiment form is the project's (``experiments.form_schema``): its model picker offers the
model catalogue (what ``GET /api/models`` lists), a field the project may not use is not in it, what a run
asks of the cluster is in a section of its own, and picking another project redraws the form for that
project. A member picks a model from the picker and creates an experiment with it."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import expect

from accounts.services import project_create
from experiments.models import Experiment
from tests.e2e.conftest import login, screenshot_dir
from tests.factories import UserFactory
from tests.platform.test_model_catalogue import write_model

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

OTHER = "\u0001other"  # the picker's "other…" entry (schema_form.js)


@pytest.fixture
def catalogue_model(settings):
    """A model directory under the first model root, which the server lists in its catalogue."""
    folder = Path(settings.MODEL_ROOTS[0]) / f"e2e-picker-{uuid.uuid4().hex[:8]}"
    write_model(folder)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_member_picks_a_model_from_the_catalogue_and_creates_an_experiment(
    page, asgi_server, catalogue_model, tmp_path
):
    user = UserFactory(username="pia")
    project_create(name="a-picker", user=user)
    trusted = project_create(name="b-trusted", user=user)
    trusted.allow_trust_remote_code = True
    trusted.save(update_fields=["allow_trust_remote_code"])
    login(page, "pia")
    page.goto("/experiments/new/")
    page.click('[data-preset="demo-cpu"]')

    picker = page.locator('[id="f-model.path"]')
    expect(picker).to_be_visible()  # an essential: first, unfolded
    served = page.request.get("/api/models").json()["models"]
    options = picker.locator("option").evaluate_all("os => os.map(o => [o.value, o.textContent])")
    offered = [(value, text) for value, text in options if value not in ("", OTHER)]
    assert [value for value, _ in offered] == [m["path"] for m in served]  # exactly the catalogue
    label = dict(offered)[str(catalogue_model)]
    backends = "/".join(next(m for m in served if m["path"] == str(catalogue_model))["backends"])
    assert re.fullmatch(rf"{catalogue_model.name} \(\d+\.\dK, chat, {backends}\)", label), label
    # The preset's own model (a tiny one it builds under the model root) is no catalogue entry: typed.
    expect(picker).to_have_value(OTHER)
    expect(page.locator('[id="f-model.path-other"]')).to_have_value(re.compile(r"tiny"))

    # The project may not run code shipped with a model: the field is not in its form; cluster fields
    # are in their own section, not among the trainer's.
    expect(page.locator('[data-path="model.trust_remote_code"]')).to_have_count(0)
    cluster = page.get_by_test_id("cluster-section")
    for path in ("resources.trainer_gpus", "trainer.device", "rollout.device", "pipeline.num_rollouters"):
        expect(cluster.locator(f'[data-path="{path}"]')).to_have_count(1)
    expect(page.locator('details[data-path="trainer"] [data-path="trainer.device"]')).to_have_count(0)

    # Another project's form: there the field is offered.
    page.select_option("#exp-project", str(trusted.pk))
    expect(page.locator('[data-path="model.trust_remote_code"]')).to_have_count(1)
    page.select_option("#exp-project", label="a-picker")
    expect(page.locator('[data-path="model.trust_remote_code"]')).to_have_count(0)

    picker.select_option(str(catalogue_model))
    expect(page.locator('[id="f-model.path-other"]')).to_be_hidden()
    page.click('details[data-path="model"] > summary')
    page.uncheck('[id="f-model.tiny"]')
    page.fill("#exp-name", "picked")
    page.screenshot(path=str(screenshot_dir(tmp_path) / "model_picker.png"))
    page.click("[data-testid=create-experiment]")
    page.wait_for_url(re.compile(r"/experiments/\d+/$"))
    exp = Experiment.objects.get()
    assert exp.name == "picked" and exp.project.name == "a-picker"
    assert exp.config["model"]["path"] == str(catalogue_model) and exp.config["model"]["tiny"] is None
    assert page.js_errors == []

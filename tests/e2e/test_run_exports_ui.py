"""The run page in a real browser: a checkpoint's Export action queues a launcher task and the row follows the
export's events live (queued -> running -> the model directory), also after a reload; held-out ``val/``
metrics get their own chart group right after ``reward/``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.conf import settings
from playwright.sync_api import expect

from accounts.services import ingest_token_issue, project_create
from experiments.run_files import checkpoint_folder
from experiments.services import run_transition
from launcher import exports
from launcher.models import Export
from tests.e2e.conftest import login
from tests.e2e.test_web_ui import as_worker, post_json
from tests.factories import ExperimentFactory, RunFactory, UserFactory, checkpoint_path
from tracking.services import checkpoint_record

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_export_a_checkpoint_from_the_run_page_and_see_val_metrics_grouped(page, asgi_server):
    user = UserFactory(username="frank")
    project = project_create(name="math", user=user)
    run = RunFactory(experiment=ExperimentFactory(project=project), number=1, created_by=user)
    token = ingest_token_issue(run=run).secret
    for to in ("starting", "running"):
        as_worker(run_transition, run_id=run.pk, to=to)
    as_worker(checkpoint_record, run_id=run.pk, step=10, path=checkpoint_path(run, 10), size_bytes=4096)
    t0 = time.time()
    post_json(asgi_server.url, f"/api/runs/{run.pk}/metrics", token, {"points": [
        {"key": k, "step": s, "value": 0.1 * s, "wall_time": t0 + s}
        for s in (0, 5, 10) for k in ("reward/mean", "val/reward_mean", "val/pass@1", "actor/pg_loss")]})  # fmt: skip
    login(page, "frank")
    page.goto(f"/runs/{run.pk}/")

    expect(page.locator("[data-group=val] h3")).to_have_text("val/ — held-out evaluation")
    groups = page.locator(".chart-group").evaluate_all("nodes => nodes.map(n => n.dataset.group)")
    assert groups[:3] == ["reward", "val", "actor"]
    expect(page.locator('[data-metric="val/pass@1"]')).to_have_attribute("data-points", "3")

    cell = page.get_by_test_id("export-state-10")
    page.get_by_test_id("export-10").click()
    expect(cell).to_have_attribute("data-state", "queued")
    expect(cell).to_contain_text("queued…")
    export = Export.objects.get(run=run)
    assert (
        export.out == str(checkpoint_folder(run) / "hf" / "step_00000010") and export.requested_by == "frank"
    )
    # what the launcher task records as the Ray job runs, arriving live (the page re-reads the table)
    for state, extra in (("running", {"job_id": "j1"}), ("succeeded", {"size_bytes": 4096})):
        as_worker(exports.export_transition, export=export, state=state, message=f"export {state}", **extra)
        expect(cell).to_have_attribute("data-state", state)
    expect(cell).to_contain_text(export.out)
    page.reload()
    expect(page.get_by_test_id("export-state-10")).to_contain_text(export.out)
    expect(page.get_by_test_id("export-10")).to_have_text("Export again")
    assert page.js_errors == []


def test_the_form_renders_the_dataset_preset_and_creates_it_unchanged(page, asgi_server):
    """The experiment form is rendered from the config schema: the dataset source's nested column
    mapping, the synthetic-data spec, the eval section and the mirror settings must come through, and
    the preset as the platform serves it (tiny model and generated data under the configured roots)
    passes the platform's path policy."""
    import re

    from experiments.models import Experiment
    from rl_engine.config import parse_config

    user = UserFactory(username="gina")
    project_create(name="gsm", user=user)
    login(page, "gina")
    page.goto("/experiments/new/?preset=gsm8k-style-tiny-cpu")
    expect(page.locator('[id="f-data.source"]')).to_have_value("dataset")
    for path in ("data.columns.prompt", "data.validation_split", "eval.every", "logging.mlflow.tracking_uri"):
        expect(page.locator(f'[data-path="{path}"]')).to_have_count(1)
    page.fill("#exp-name", "gsm8k style")
    page.click("[data-testid=create-experiment]")
    page.wait_for_url(re.compile(r"/experiments/\d+/$"))
    stored = Experiment.objects.get(name="gsm8k style").config
    served = page.request.get("/api/presets/gsm8k-style-tiny-cpu").json()
    assert stored == parse_config(served).model_dump(mode="json")
    assert stored["data"]["path"] == str(Path(settings.DATA_ROOTS[0]) / "gsm8k-style")
    assert page.js_errors == []

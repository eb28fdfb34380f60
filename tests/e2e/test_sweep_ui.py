"""A sweep in a real browser (issue 22): a 3-run sweep of the demo preset at concurrency 2 created with
the experiment page's "New sweep" form (a bad search space first: the refusal names its field), then
its page follows the runs live while the launcher's admission (the real ``runs_admit``, called as the
worker calls it) keeps two of them busy, ranks them by the metric (last value, then best) and draws the
parameter against the metric."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from accounts.services import project_create
from experiments.models import Run
from experiments.services import experiment_create, run_transition
from launcher.services import runs_admit
from rl_engine.config import parse_config
from sweeps.models import SweepRun
from tests.e2e.conftest import login, screenshot_dir
from tests.e2e.test_web_ui import as_worker
from tests.factories import UserFactory, demo_config
from tracking.services import Point, metrics_ingest

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# reward/mean per step of the runs, by index: index 1 ends best, index 0 peaks highest.
SERIES = {0: [0.1, 0.9, 0.3], 1: [0.2, 0.5, 0.6], 2: [0.1, 0.2, 0.25]}


def test_a_three_run_sweep_of_the_demo_preset_reaches_its_ranking_view(page, asgi_server, tmp_path, settings):
    user = UserFactory(username="sam")
    project = project_create(name="sweepers", user=user)
    cfg = demo_config()
    cfg["trainer"]["total_steps"] = 3  # tiny: three steps
    exp = experiment_create(project=project, user=user, name="demo", config=parse_config(cfg))

    login(page, "sam")
    page.goto(f"/experiments/{exp.pk}/")
    page.get_by_test_id("sweep-new-toggle").click()
    page.select_option("#sweep-method", "grid")
    page.fill("#sweep-space", '{"trainer.lr": "uniform(1e-6, 1e-5)"}')  # a distribution in a grid
    page.fill("#sweep-max-concurrent", "2")
    page.get_by_test_id("sweep-create").click()
    expect(page.locator('#sweep-form-error [data-field="search_space.trainer.lr"]')).to_contain_text("grid")
    assert not SweepRun.objects.exists()

    page.fill("#sweep-space", '{"trainer.lr": [1e-6, 3e-6, 1e-5]}')
    page.get_by_test_id("sweep-create").click()
    page.wait_for_url(re.compile(r"/sweeps/\d+/$"))
    sweep_id = int(page.url.rstrip("/").split("/")[-1])
    members = list(SweepRun.objects.filter(sweep_id=sweep_id).order_by("index"))
    assert [m.params["trainer.lr"] for m in members] == [1e-6, 3e-6, 1e-5]
    ids = [m.run_id for m in members]
    rows = page.get_by_test_id("sweep-runs").locator("tbody tr")
    expect(rows).to_have_count(3)
    expect(page.get_by_test_id("sweep-state")).to_have_text("queued")

    # The worker's admission: a global limit of 4, the sweep's cap of 2.
    settings.RUN_CONCURRENCY_LIMIT = 4
    admitted = as_worker(runs_admit)
    assert admitted == ids[:2]
    for run_id in admitted:
        as_worker(run_transition, run_id=run_id, to="running")
    for index, run_id in enumerate(ids[:2]):
        as_worker(metrics_ingest, run_id=run_id,
                  points=[Point("reward/mean", s, v, 0.0) for s, v in enumerate(SERIES[index])])  # fmt: skip
    expect(page.get_by_test_id("sweep-state")).to_have_text("running")  # the page follows by itself
    expect(page.locator(f'tr[data-run-id="{ids[0]}"] [data-field="state"]')).to_have_text("running")
    expect(page.locator(f'tr[data-run-id="{ids[2]}"] [data-field="state"]')).to_have_text("queued")

    # One finishes: its slot goes to the third run; then both others finish.
    as_worker(run_transition, run_id=ids[0], to="succeeded")
    assert as_worker(runs_admit) == [ids[2]]
    as_worker(run_transition, run_id=ids[2], to="running")
    as_worker(
        metrics_ingest,
        run_id=ids[2],
        points=[Point("reward/mean", s, v, 0.0) for s, v in enumerate(SERIES[2])],
    )
    for run_id in ids[1:]:
        as_worker(run_transition, run_id=run_id, to="succeeded")
    assert Run.objects.filter(pk__in=ids, state="succeeded").count() == 3

    expect(page.get_by_test_id("sweep-state")).to_have_text("finished")
    # Ranked by the last value (the sweep's default): index 1 (0.6), 0 (0.3), 2 (0.25).
    expect(rows.locator('[data-field="rank"]')).to_have_text(["1", "2", "3"])
    expect(rows.first).to_have_attribute("data-run-id", str(ids[1]))
    assert [rows.nth(i).get_attribute("data-run-id") for i in range(3)] == [str(ids[i]) for i in (1, 0, 2)]
    # By the best value: index 0 (0.9) first.
    page.select_option("[data-testid=sweep-summary-select]", "best")
    expect(rows.first).to_have_attribute("data-run-id", str(ids[0]))
    assert [rows.nth(i).get_attribute("data-run-id") for i in range(3)] == [str(ids[i]) for i in (0, 1, 2)]
    # The parameter/metric chart has one point per run.
    expect(page.locator("#sweep-chart-note")).to_have_text("3 of 3 runs have a reward/mean value")
    expect(page.locator("#sweep-chart canvas")).to_have_count(1)
    # A column sorts on a click: the searched parameter, descending first.
    page.locator('th[data-sort="param:trainer.lr"]').click()
    expect(rows.first).to_have_attribute("data-run-id", str(ids[2]))
    page.screenshot(path=str(screenshot_dir(tmp_path) / "sweep_page.png"), full_page=True)
    assert page.js_errors == []

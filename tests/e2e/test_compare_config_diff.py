"""The compare page's "Config differences" table in a real browser: runs created with different configs,
the table fetched from GET /api/runs/compare lists the field that differs (one column per run) and not
one that is equal; a run whose stored config no longer parses is said to be compared as stored; picking
other runs and pressing Show redraws it."""

from __future__ import annotations

import copy

import pytest
from playwright.sync_api import expect

from accounts.services import project_create
from tests.e2e.conftest import login, screenshot_dir
from tests.e2e.test_web_ui import as_worker
from tests.factories import ExperimentFactory, RunFactory, UserFactory, stored_demo_config
from tracking.services import Point, metrics_ingest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_compare_page_lists_the_config_fields_that_differ(page, asgi_server, tmp_path):
    user = UserFactory(username="gina")
    project = project_create(name="sweepish", user=user)
    base = stored_demo_config()
    base["trainer"]["lr"] = 1e-6
    fast = copy.deepcopy(base)
    fast["trainer"]["lr"] = 3e-6
    old = copy.deepcopy(base)
    old["trainer"]["legacy_knob"] = 1  # a field of an older schema: this config no longer parses
    slow_run = RunFactory(experiment=ExperimentFactory(project=project, name="slow", config=base), number=1)
    fast_run = RunFactory(experiment=ExperimentFactory(project=project, name="fast", config=fast), number=1)
    old_run = RunFactory(experiment=ExperimentFactory(project=project, name="old", config=old), number=1)
    as_worker(
        metrics_ingest,
        run_id=slow_run.pk,
        points=[Point("reward/mean", s, 0.1 * s, 0.0) for s in range(1, 6)],
    )

    login(page, "gina")
    page.goto(f"/compare/?runs={slow_run.pk},{fast_run.pk}&key=reward/mean")
    table = page.get_by_test_id("config-diff")
    expect(page.locator("#diff-note")).to_have_text("1 field differs")
    # One column per run, in the order of the run picker (the chart's legend).
    expect(table.locator("thead th")).to_have_count(3)
    columns = table.locator("thead th").all_text_contents()
    assert columns[0] == "field" and sorted(columns[1:]) == ["fast #1", "slow #1"]
    lr_values = {"slow #1": "1e-6", "fast #1": "3e-6"}  # small numbers exactly, in exponent form
    lr = table.locator('tr[data-path="trainer.lr"] td')
    expect(lr).to_have_text(["trainer.lr", *(lr_values[c] for c in columns[1:])])
    expect(table.locator("tbody tr")).to_have_count(1)
    # Equal in both runs, so not a row (the seed, the step budget, the model).
    expect(table.locator('tr[data-path="trainer.total_steps"]')).to_have_count(0)
    expect(table.locator('tr[data-path="seed"]')).to_have_count(0)
    expect(page.locator("#compare-chart .u-legend")).to_contain_text("slow #1")
    page.screenshot(path=str(screenshot_dir(tmp_path) / "compare_config_diff.png"), full_page=True)

    # Pick the slow run and the old one instead, then Show: the table follows the new choice.
    page.select_option("#compare-runs", [str(slow_run.pk), str(old_run.pk)])
    page.click("#compare-form button[type=submit]")
    expect(table.locator("thead th")).to_contain_text(["field", "old #1"])
    expect(table.locator('tr[data-path="trainer.lr"]')).to_have_count(0)
    columns = table.locator("thead th").all_text_contents()
    assert columns[0] == "field" and sorted(columns[1:]) == ["old #1", "slow #1"]
    knob_values = {"slow #1": "(absent)", "old #1": "1"}
    expect(table.locator('tr[data-path="trainer.legacy_knob"] td')).to_have_text(
        ["trainer.legacy_knob", *(knob_values[c] for c in columns[1:])]
    )
    expect(page.locator("#diff-basis")).to_contain_text("old #1: compared as stored")
    expect(page.locator("#diff-basis")).to_contain_text("trainer.legacy_knob")

    # One run has nothing to compare with.
    page.select_option("#compare-runs", [str(fast_run.pk)])
    page.click("#compare-form button[type=submit]")
    expect(page.locator("#diff-note")).to_have_text("Pick two runs or more to see how their configs differ.")
    expect(table.locator("tbody tr")).to_have_count(0)
    assert page.js_errors == []

"""Alerts in a real browser (issue 22): an engine alert posted to the ingestion API appears live as a banner
on the run page (its repeat bumps it), a member resolves it there, a run's failure shows up as its own
alert, and the experiment page badges the run with its open alerts."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from accounts.services import ingest_token_issue, project_create
from alerts.models import Alert
from experiments.services import run_transition
from tests.e2e.conftest import login
from tests.e2e.test_web_ui import as_worker, post_json
from tests.factories import ExperimentFactory, RunFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_an_alert_banner_appears_live_is_resolved_and_badges_the_run(page, asgi_server):
    user = UserFactory(username="ada")
    project = project_create(name="alerts", user=user)
    run = RunFactory(experiment=ExperimentFactory(project=project), number=1, created_by=user)
    token = ingest_token_issue(run=run).secret
    for to in ("starting", "running"):
        as_worker(run_transition, run_id=run.pk, to=to)
    login(page, "ada")
    page.goto(f"/runs/{run.pk}/")
    expect(page.locator("#live-text")).to_have_text("live")
    banner = page.get_by_test_id("run-alerts")
    expect(banner).to_be_hidden()

    hostile = "<img src=x onerror=alert(1)> rollout stalled for 600 s"
    post_json(
        asgi_server.url,
        f"/api/runs/{run.pk}/events",
        token,
        {"events": [{"kind": "alert", "message": hostile}]},
    )
    row = page.get_by_test_id("run-alert")
    expect(row).to_have_count(1)
    expect(row).to_have_attribute("data-kind", "engine")
    expect(row).to_contain_text(hostile)  # as text, never as HTML
    assert page.locator("#run-alerts img").count() == 0
    post_json(
        asgi_server.url,
        f"/api/runs/{run.pk}/events",
        token,
        {"events": [{"kind": "alert", "message": "again"}]},
    )
    expect(row).to_contain_text("again")
    expect(row).to_have_attribute("data-count", "2")

    page.get_by_test_id("resolve-alert").click()
    expect(banner).to_be_hidden()
    assert Alert.objects.get(run=run).resolved_at is not None

    as_worker(run_transition, run_id=run.pk, to="failed", error="driver died")
    expect(row).to_have_attribute("data-kind", "run_failed")
    expect(row).to_contain_text("driver died")

    page.goto(f"/experiments/{run.experiment_id}/")
    expect(page.locator(f'tr[data-run-id="{run.pk}"] [data-testid=run-alerts-badge]')).to_have_text("⚠ 1")

"""Webhooks in a real browser (issue 22): an owner adds one on the project's settings page (a private URL
is refused with the API's message at the field), sees its latest delivery and its delivery log,
disables and deletes it; a member only sees that webhooks are the owners' business."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from accounts.models import Role
from accounts.services import project_create
from alerts.models import AlertKind, DeliveryStatus, Webhook, WebhookDelivery
from alerts.services import alert_raise
from tests.e2e.conftest import login
from tests.factories import ExperimentFactory, MembershipFactory, RunFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PUBLIC_URL = "https://93.184.216.34/rl-alerts?team=<b>ml</b>"  # a public address: no DNS, never contacted


def test_an_owner_adds_a_webhook_sees_a_refused_url_and_its_deliveries(page, asgi_server):
    owner = UserFactory(username="ada")
    project = project_create(name="hooks", user=owner)
    MembershipFactory(project=project, role=Role.MEMBER, user=UserFactory(username="bob"))
    run = RunFactory(experiment=ExperimentFactory(project=project), number=1, created_by=owner)
    login(page, "ada")
    page.get_by_test_id("project-settings").click()
    page.wait_for_url(f"**/projects/{project.pk}/")
    expect(page.locator("#webhooks-empty")).to_be_visible()

    page.get_by_test_id("webhook-url").fill("http://10.1.2.3/hook")
    page.get_by_test_id("webhook-add").click()
    error = page.get_by_test_id("webhook-url-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("resolves to 10.1.2.3, a private address")
    assert not Webhook.objects.exists()

    page.get_by_test_id("webhook-url").fill(PUBLIC_URL)
    page.get_by_test_id("webhook-event-engine").check()
    page.get_by_test_id("webhook-add").click()
    expect(page.get_by_test_id("webhook-secret")).to_be_visible()
    expect(error).to_be_hidden()
    hook = Webhook.objects.get()
    assert (hook.url, hook.events, hook.active) == (PUBLIC_URL, ["engine"], True)
    expect(page.get_by_test_id("webhook-secret-value")).to_have_text(hook.secret)  # shown this once
    row = page.get_by_test_id("webhook")
    expect(row).to_have_count(1)
    expect(row.locator("[data-field=url]")).to_have_text(PUBLIC_URL)  # as text, never as HTML
    expect(row.locator("[data-field=events]")).to_have_text("engine")
    expect(row.locator("[data-field=last-delivery]")).to_have_text("none yet")

    # An alert queues a delivery; a worker's attempts (none runs here) leave it retrying after a 503.
    alert = alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="stalled").alert
    WebhookDelivery.objects.filter(webhook=hook).update(
        status=DeliveryStatus.RETRYING, attempts=2, status_code=503, last_error="HTTP 503"
    )
    page.reload()
    expect(row.locator("[data-field=last-delivery]")).to_contain_text("retrying")
    expect(row.locator("[data-field=last-delivery]")).to_contain_text("2 attempts, HTTP 503")
    page.get_by_test_id("webhook-log").click()
    delivery = page.get_by_test_id("delivery")
    expect(delivery).to_have_count(1)
    expect(delivery).to_contain_text(f"#{alert.pk}")
    expect(delivery).to_contain_text("HTTP 503")
    expect(delivery.locator("[data-field=attempts]")).to_have_text("2")

    page.get_by_test_id("webhook-toggle").click()
    expect(row.locator("[data-field=active]")).to_have_text("disabled")
    assert Webhook.objects.get().active is False
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("webhook-delete").click()
    expect(page.locator("#webhooks-empty")).to_be_visible()
    assert not Webhook.objects.exists()

    page.context.clear_cookies()
    login(page, "bob")
    page.goto(f"/projects/{project.pk}/")
    expect(page.get_by_test_id("webhooks-owners-only")).to_be_visible()
    expect(page.get_by_test_id("webhook-form")).to_have_count(0)

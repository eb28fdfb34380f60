"""What one project's members can make the platform do is bounded (docs/api.md, "Trust boundary"): a cap
on webhooks and metric rules (a 400 naming the limit), per-project throttles on the actions that queue
work (a 429 with Retry-After), an hourly budget of webhook deliveries, rule passes one at a time (a real
second pass while the first runs skips) that read a bounded number of points, and webhook deliveries on
a queue of their own that every worker started the documented ways consumes."""

from __future__ import annotations

import shlex
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.db import connection, transaction
from django.utils import timezone

from accounts.services import ingest_token_issue
from accounts.throttles import FixedWindowThrottle
from alerts import rules
from alerts.models import (
    Alert,
    AlertKind,
    DeliveryStatus,
    Goal,
    MetricRule,
    RuleKind,
    RuleState,
    Webhook,
    WebhookDelivery,
)
from alerts.rules import rule_evaluate, rules_evaluate
from alerts.services import alert_raise, alert_resolve
from experiments.models import RunState
from experiments.services import run_create, run_transition
from tests.conftest import REPO_ROOT, wait_for
from tests.factories import ExperimentFactory
from tests.platform.conftest import client_for
from tracking.services import Point, metrics_ingest

HOOK_URL = "http://127.0.0.1:9/hook"  # never called here: deliveries are only queued


@pytest.fixture
def run(team):
    exp = ExperimentFactory(project=team["project"], created_by=team["member"])
    return run_create(experiment=exp, user=team["member"])


@pytest.fixture
def hooks_allowed(settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    return settings


@pytest.fixture
def rates(settings, monkeypatch):
    """Lower the per-project rates; the throttles' clock stopped mid-hour (windows align to the clock)."""
    monkeypatch.setattr(FixedWindowThrottle, "timer", staticmethod(lambda: 1_800_001_800.0))

    def set_rates(**rates: str) -> None:
        current = dict(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"])
        settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {**current, **rates}}

    return set_rates


def assert_throttled(resp) -> None:
    assert resp.status_code == 429, resp.content[:300]
    assert int(resp["Retry-After"]) >= 1


def _running(run):
    run_transition(run_id=run.pk, to=RunState.STARTING)
    run_transition(run_id=run.pk, to=RunState.RUNNING)
    return run


def _points(key, values, start=0):
    return [Point(key, start + i, float(v), 0.0) for i, v in enumerate(values)]


# --- caps ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_webhooks_and_rules_past_the_projects_cap_are_a_400_naming_the_limit(team, hooks_allowed):
    hooks_allowed.WEBHOOKS_PER_PROJECT, hooks_allowed.ALERT_RULES_PER_PROJECT = 3, 2
    owner, member = client_for(team["owner"]), client_for(team["member"])
    hook = {"project": team["project"].pk, "url": HOOK_URL}
    made = [owner.post("/api/webhooks", hook, format="json") for _ in range(3)]
    assert [r.status_code for r in made] == [201, 201, 201]
    refused = owner.post("/api/webhooks", hook, format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"] == {
        "project": ["this project has 3 webhooks, the most it may have (WEBHOOKS_PER_PROJECT)"]
    }
    assert Webhook.objects.filter(project=team["project"]).count() == 3
    theirs = {"project": team["other_project"].pk, "url": HOOK_URL}
    assert client_for(team["stranger"]).post("/api/webhooks", theirs, format="json").status_code == 201
    assert owner.delete(f"/api/webhooks/{made[0].json()['id']}").status_code == 204
    assert owner.post("/api/webhooks", hook, format="json").status_code == 201  # a place again

    rule = {"project": team["project"].pk, "metric": "loss", "kind": "missing", "steps": 5}
    assert [member.post("/api/alert-rules", rule, format="json").status_code for _ in range(2)] == [201, 201]
    refused = member.post("/api/alert-rules", rule, format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"] == {
        "project": ["this project has 2 metric rules, the most it may have (ALERT_RULES_PER_PROJECT)"]
    }
    assert MetricRule.objects.filter(project=team["project"]).count() == 2


# --- throttles ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_actions_that_queue_work_are_throttled_per_project(team, run, rates, hooks_allowed):
    rates(alert_resolve="2/hour", alert_events="2/hour", alert_rule_writes="2/hour", webhook_writes="2/hour")
    member, owner = client_for(team["member"]), client_for(team["owner"])
    url = f"/api/runs/{run.pk}/events"
    alert = {"events": [{"kind": "alert", "message": "stalled"}]}

    # a member's alert events, per project (a log event is not counted)
    assert [member.post(url, alert, format="json").status_code for _ in range(2)] == [201, 201]
    assert member.post(url, {"events": [{"kind": "log", "message": "x"}]}, format="json").status_code == 201
    assert_throttled(client_for(team["owner"]).post(url, alert, format="json"))  # the project's count
    # the run's own engine is not: its alerts repeat the run's open alert
    engine = client_for(token=ingest_token_issue(run=run).secret)
    assert [engine.post(url, alert, format="json").status_code for _ in range(3)] == [201, 201, 201]

    # resolving, per project
    other = run_create(experiment=run.experiment, user=team["member"])
    third = run_create(experiment=run.experiment, user=team["member"])
    alerts = [alert_raise(run_id=r.pk, kind=AlertKind.ENGINE, message="m").alert for r in (run, other, third)]
    for a in alerts[:2]:
        assert member.post(f"/api/alerts/{a.pk}/resolve").status_code == 200
    assert_throttled(member.post(f"/api/alerts/{alerts[2].pk}/resolve"))
    assert Alert.objects.get(pk=alerts[2].pk).resolved_at is None
    theirs_run = run_create(
        experiment=ExperimentFactory(project=team["other_project"]), user=team["stranger"]
    )
    theirs = alert_raise(run_id=theirs_run.pk, kind=AlertKind.ENGINE, message="m").alert
    assert client_for(team["stranger"]).post(f"/api/alerts/{theirs.pk}/resolve").status_code == 200

    # rule writes (a change re-reads every running run), per project
    body = {"project": team["project"].pk, "metric": "loss", "kind": "missing", "steps": 5}
    created = member.post("/api/alert-rules", body, format="json")
    assert created.status_code == 201
    rule_url = f"/api/alert-rules/{created.json()['id']}"
    assert member.patch(rule_url, {"metric": "reward"}, format="json").status_code == 200
    assert_throttled(member.patch(rule_url, {"metric": "kl"}, format="json"))
    assert_throttled(member.delete(rule_url))
    assert MetricRule.objects.get(pk=created.json()["id"]).metric == "reward"

    # webhook writes, per project
    made = owner.post("/api/webhooks", {"project": team["project"].pk, "url": HOOK_URL}, format="json")
    assert made.status_code == 201
    hook_url = f"/api/webhooks/{made.json()['id']}"
    assert owner.patch(hook_url, {"active": False}, format="json").status_code == 200
    assert_throttled(owner.patch(hook_url, {"active": True}, format="json"))
    assert_throttled(
        owner.post("/api/webhooks", {"project": team["project"].pk, "url": HOOK_URL}, format="json")
    )


@pytest.mark.django_db
def test_deliveries_past_the_projects_hourly_budget_are_not_queued_and_the_alert_says_so(team, run, settings):
    settings.WEBHOOK_DELIVERIES_PER_HOUR = 5
    for _ in range(3):
        Webhook.objects.create(project=team["project"], url=HOOK_URL, secret="s")
    Webhook.objects.create(project=team["other_project"], url=HOOK_URL, secret="s")
    queued: list[int] = []
    for _ in range(3):
        alert = alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="stalled").alert
        queued.append(WebhookDelivery.objects.filter(alert=alert).count())
        alert_resolve(alert=alert, user=None)
    assert queued == [3, 2, 0]  # 5 an hour for the project's 3 webhooks together
    skipped = list(Alert.objects.filter(run=run).order_by("pk").values_list("detail", flat=True))
    assert [d.get("webhooks_not_notified") for d in skipped] == [None, 1, 3]
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {DeliveryStatus.PENDING}
    # another project's budget is its own
    theirs_run = run_create(
        experiment=ExperimentFactory(project=team["other_project"]), user=team["stranger"]
    )
    theirs = alert_raise(run_id=theirs_run.pk, kind=AlertKind.ENGINE, message="m").alert
    assert WebhookDelivery.objects.filter(alert=theirs).count() == 1
    # deliveries older than the hour no longer count
    WebhookDelivery.objects.filter(webhook__project=team["project"]).update(
        created=timezone.now() - timedelta(hours=1, seconds=1)
    )
    alert = alert_raise(run_id=run.pk, kind=AlertKind.ENGINE, message="again").alert
    assert WebhookDelivery.objects.filter(alert=alert).count() == 3


# --- rule passes --------------------------------------------------------------------------------------


def _lock_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_a_second_rule_pass_while_the_first_runs_skips(team, run):
    """Two real passes at once: the first is held mid-way by a row another transaction has inserted and
    not committed (its state row for the rule and run: the pass's insert waits on it); the second,
    started meanwhile, skips; the first then finishes, and the next pass runs."""
    if connection.vendor != "postgresql":
        pytest.skip("holding a pass mid-way on a row lock needs PostgreSQL (the production pass runs it)")
    _running(run)
    rule = MetricRule.objects.create(
        project=team["project"], metric="loss", kind=RuleKind.NO_IMPROVEMENT, steps=2
    )
    metrics_ingest(run_id=run.pk, points=_points("loss", [3, 2, 1]))
    inserted, release = threading.Event(), threading.Event()
    results: dict[str, int | None] = {}

    def hold_the_row() -> None:
        try:
            with transaction.atomic():
                RuleState.objects.create(rule=rule, run=run)
                inserted.set()
                release.wait(60)
                transaction.set_rollback(True)
        finally:
            connection.close()

    def first_pass() -> None:
        try:
            results["first"] = rules_evaluate()
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    first = threading.Thread(target=first_pass)
    try:
        assert inserted.wait(30)
        first.start()
        wait_for(lambda: _lock_waiters() >= 1, timeout_s=30, message="the first pass to wait on the row")
        assert rules_evaluate() is None  # the second pass: skipped, the first still holds the lock
        assert first.is_alive() and "first" not in results
    finally:
        release.set()
        holder.join(30)
        first.join(60)
    assert results["first"] == 1
    assert RuleState.objects.get(rule=rule, run=run).checked_step == 2
    assert rules_evaluate() == 1  # the lock was released


@pytest.mark.django_db(transaction=True)
def test_a_pass_skips_while_another_thread_holds_the_pass_lock(team, run):
    """The same on every deployment: a pass holding the lock in another thread, a pass here skips."""
    _running(run)
    MetricRule.objects.create(project=team["project"], metric="loss", kind=RuleKind.MISSING, steps=1)
    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def holder() -> None:
        with rules.pass_lock() as got:
            assert got
            held.set()
            release.wait(60)
        done.set()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(30)
        assert rules_evaluate() is None
        assert not RuleState.objects.exists()
    finally:
        release.set()
        thread.join(30)
    assert done.is_set() and rules_evaluate() == 1


@pytest.mark.django_db
def test_a_rule_reads_a_bounded_number_of_points_per_pass_and_decides_once_caught_up(team, run, settings):
    settings.ALERT_RULE_POINTS_PER_PASS = 10
    _running(run)
    values = [1, 2, 5, 4, 3] + [2] * 20  # best (5) at step 2; 25 points
    metrics_ingest(run_id=run.pk, points=_points("reward", values))
    rule = MetricRule.objects.create(
        project=team["project"], metric="reward", kind=RuleKind.NO_IMPROVEMENT, goal=Goal.MAX, steps=5
    )
    # the brute-force reference: the best's first step, and how long ago it was at the last point
    best_step = values.index(max(values))
    assert len(values) - 1 - best_step >= rule.steps
    passes = []
    while True:
        finding = rule_evaluate(rule, run.pk)
        passes.append(RuleState.objects.get(rule=rule, run=run).checked_step)
        if finding.complete:
            break
        assert not Alert.objects.exists()  # nothing decided on part of the points
    assert passes == [9, 19, 24]
    alert = Alert.objects.get(kind=AlertKind.RULE)
    assert alert.detail["best_step"] == best_step and alert.detail["last_step"] == 24
    # a changed rule starts over: its partial passes neither resolve nor repeat the open alert
    rule.goal = Goal.MIN
    rule.save()
    RuleState.objects.filter(rule=rule).delete()
    assert rule_evaluate(rule, run.pk).complete is False
    alert.refresh_from_db()
    assert alert.resolved_at is None and alert.count == 1


# --- the deliveries' queue ----------------------------------------------------------------------------


def test_webhook_deliveries_have_a_queue_of_their_own_that_every_worker_consumes(settings):
    from config.celery import app

    queue = app.amqp.router.route({}, "alerts.deliver_webhook")["queue"].name
    assert queue == settings.CELERY_DELIVERY_QUEUE == f"{settings.CELERY_TASK_DEFAULT_QUEUE}-deliveries"
    assert app.amqp.router.route({}, "launcher.start_run")["queue"].name == settings.CELERY_LAUNCHER_QUEUE
    assert queue not in {settings.CELERY_LAUNCHER_QUEUE, settings.CELERY_TASK_DEFAULT_QUEUE}
    # a worker started without -Q consumes the default queue and the deliveries'
    assert {settings.CELERY_TASK_DEFAULT_QUEUE, queue} <= set(app.amqp.queues.consume_from)
    # ...which is how compose and docs/deploy.md start theirs; a -Q anywhere must name the deliveries
    compose = yaml.safe_load((REPO_ROOT / "docker" / "compose.yaml").read_text())
    assert "-Q" not in compose["services"]["worker"]["command"]
    deploy = (Path(REPO_ROOT) / "docs" / "deploy.md").read_text()
    workers = [line for line in deploy.splitlines() if "celery -A config worker" in line]
    assert workers
    for line in workers:
        command = line[line.index("celery -A config worker") :].split("`")[0]
        args = shlex.split(command)
        assert "-Q" not in args or "deliveries" in args[args.index("-Q") + 1], line

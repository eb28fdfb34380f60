"""Alerts the platform raises (engine alert events, run failures, metric rules), their API, and their
live message. Webhook delivery is in test_webhooks.py."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from accounts.services import ingest_token_issue
from alerts.models import Alert, AlertKind, Goal, MetricRule, RuleKind
from alerts.rules import rule_evaluate, rules_evaluate
from alerts.services import MESSAGE_MAX, alert_resolve
from experiments.models import RunState
from experiments.services import run_create, run_transition
from rl_engine import wire
from rl_engine.wire import EventKind
from tests.factories import ExperimentFactory
from tests.platform.conftest import client_for
from tracking.services import NewEvent, Point, events_append, events_ingest, metrics_ingest

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(team):
    exp = ExperimentFactory(project=team["project"], created_by=team["member"])
    return run_create(experiment=exp, user=team["member"])


def _running(run):
    run_transition(run_id=run.pk, to=RunState.STARTING)
    run_transition(run_id=run.pk, to=RunState.RUNNING)
    return run


def _points(key, values, start=0):
    return [Point(key, start + i, float(v), 0.0) for i, v in enumerate(values)]


# --- what is an alert ---------------------------------------------------------------------------------


def test_an_engine_alert_event_opens_one_alert_and_repeats_bump_it(run):
    client = client_for(token=ingest_token_issue(run=run).secret)
    long = "stalled rollout " + "x" * 5000
    resp = client.post(
        f"/api/runs/{run.pk}/events", {"events": [{"kind": "alert", "message": long}]}, format="json"
    )
    assert resp.status_code == 201
    alert = Alert.objects.get(run=run)
    assert (alert.kind, alert.count, alert.project_id) == (AlertKind.ENGINE, 1, run.project_id)
    assert alert.message.startswith("stalled rollout") and len(alert.message) == MESSAGE_MAX
    first_seen, last_seen = alert.first_seen, alert.last_seen
    body = {"events": [{"kind": "alert", "message": "hung weight sync"}, {"kind": "log", "message": "x"}]}
    assert client.post(f"/api/runs/{run.pk}/events", body, format="json").status_code == 201
    alert.refresh_from_db()
    assert Alert.objects.filter(run=run).count() == 1
    assert (alert.count, alert.message, alert.first_seen) == (2, "hung weight sync", first_seen)
    assert alert.last_seen > last_seen


def test_a_resent_batch_does_not_count_twice_and_logs_or_status_are_no_alerts(run):
    events = [NewEvent(kind=EventKind.ALERT, message="a")]
    events_ingest(run_id=run.pk, events=events, batch_id="b1")
    events_ingest(run_id=run.pk, events=events, batch_id="b1")  # the same batch again: stores nothing
    events_append(run_id=run.pk, kind=EventKind.LOG, message="log")
    assert list(Alert.objects.values_list("kind", "count")) == [(AlertKind.ENGINE, 1)]


def test_a_run_failure_is_an_alert_and_a_resolved_alert_reopens_as_a_new_one(run):
    _running(run)
    run_transition(run_id=run.pk, to=RunState.FAILED, error="driver died: OOM")
    alert = Alert.objects.get(run=run)
    assert (alert.kind, alert.message) == (AlertKind.RUN_FAILED, "driver died: OOM")
    alert_resolve(alert=alert, user=None)
    events_ingest(run_id=run.pk, events=[NewEvent(kind=EventKind.ALERT, message="late")])
    events_ingest(run_id=run.pk, events=[NewEvent(kind=EventKind.ALERT, message="later")])
    rows = sorted((a.kind, a.count, a.resolved_at is None) for a in Alert.objects.all())
    assert rows == [(AlertKind.ENGINE, 2, True), (AlertKind.RUN_FAILED, 1, False)]


def test_the_alert_is_published_live_after_commit(run, listen, django_capture_on_commit_callbacks):
    listener = listen(run.pk)
    with django_capture_on_commit_callbacks(execute=True):
        events_ingest(run_id=run.pk, events=[NewEvent(kind=EventKind.ALERT, message="stalled")])
    messages = []
    while True:
        try:
            messages.append(listener.receive_payload(timeout=1.0))
        except TimeoutError:
            break
    alerts = [m for m in messages if m["kind"] == wire.LiveKind.ALERT]
    assert len(alerts) == 1
    TypeAdapter(wire.LiveMessage).validate_python(alerts[0])
    assert alerts[0]["alert"]["message"] == "stalled" and alerts[0]["alert"]["resolved_at"] is None


# --- metric rules -------------------------------------------------------------------------------------


def test_no_improvement_opens_after_n_steps_resolves_on_improvement_and_is_incremental(team, run):
    rule = MetricRule.objects.create(
        project=team["project"], metric="reward/mean", kind=RuleKind.NO_IMPROVEMENT, goal=Goal.MAX, steps=10
    )
    # best 0.5 first reached at step 2 (a tie at step 5 is no improvement), latest step 11: 9 steps
    metrics_ingest(
        run_id=run.pk, points=_points("reward/mean", [0.1, 0.2, 0.5, 0.4, 0.3, 0.5, 0.1, 0, 0, 0, 0, 0])
    )
    assert rule_evaluate(rule, run.pk).holds is False
    metrics_ingest(run_id=run.pk, points=_points("reward/mean", [0.49], start=12))  # 10 steps now
    finding = rule_evaluate(rule, run.pk)
    assert finding.holds and finding.fingerprint == 2
    alert = Alert.objects.get(run=run, kind=AlertKind.RULE)
    assert alert.rule == rule and "reward/mean has not improved for 10 steps" in alert.message
    assert alert.detail["best_step"] == 2 and alert.detail["best_value"] == 0.5
    rule_evaluate(rule, run.pk)  # still true: the same alert, repeated
    alert.refresh_from_db()
    assert alert.count == 2 and Alert.objects.count() == 1
    metrics_ingest(run_id=run.pk, points=_points("reward/mean", [0.9], start=13))
    assert rule_evaluate(rule, run.pk).holds is False
    alert.refresh_from_db()
    assert alert.resolved_at is not None


def test_min_goal_and_a_person_resolving_is_respected_until_something_changes(team, run):
    rule = MetricRule.objects.create(
        project=team["project"], metric="loss", kind=RuleKind.NO_IMPROVEMENT, goal=Goal.MIN, steps=3
    )
    metrics_ingest(run_id=run.pk, points=_points("loss", [2.0, 1.0, 1.5, 1.2, 1.1]))
    assert rule_evaluate(rule, run.pk).holds
    alert_resolve(alert=Alert.objects.get(run=run), user=None)
    metrics_ingest(run_id=run.pk, points=_points("loss", [1.3], start=5))
    rule_evaluate(rule, run.pk)  # still no improvement since step 1, which the person has seen
    assert Alert.objects.filter(resolved_at=None).count() == 0
    metrics_ingest(run_id=run.pk, points=_points("loss", [0.5, 0.6, 0.7, 0.8], start=6))
    rule_evaluate(rule, run.pk)  # a new best at step 6, then 3 steps without improving: a new alert
    reopened = Alert.objects.get(resolved_at=None)
    assert reopened.detail["best_step"] == 6


def test_missing_metric_is_how_a_nan_loss_shows(team, run):
    """The engine's sink drops a NaN loss and the ingestion refuses one: the key stops while others go on."""
    with pytest.raises(ValueError, match="finite"):
        metrics_ingest(run_id=run.pk, points=[Point("loss", 0, float("nan"), 0.0)])
    rule = MetricRule.objects.create(project=team["project"], metric="loss", kind=RuleKind.MISSING, steps=5)
    metrics_ingest(run_id=run.pk, points=_points("loss", [1.0, 0.9, 0.8]) + _points("reward", [0] * 7))
    assert rule_evaluate(rule, run.pk).holds is False  # run at step 6, loss at 2: 4 steps
    metrics_ingest(run_id=run.pk, points=_points("reward", [0], start=7))
    assert rule_evaluate(rule, run.pk).holds
    alert = Alert.objects.get(kind=AlertKind.RULE)
    assert "loss has had no value since step 2" in alert.message and alert.detail["run_step"] == 7


def test_the_beat_pass_evaluates_active_rules_on_running_runs_only(team, run):
    exp = ExperimentFactory(project=team["project"])
    queued = run_create(experiment=exp, user=team["member"])
    _running(run)
    MetricRule.objects.create(project=team["project"], metric="loss", kind=RuleKind.MISSING, steps=1)
    MetricRule.objects.create(
        project=team["project"], metric="x", kind=RuleKind.MISSING, steps=1, active=False
    )
    MetricRule.objects.create(project=team["other_project"], metric="loss", kind=RuleKind.MISSING, steps=1)
    for r in (run, queued):
        metrics_ingest(run_id=r.pk, points=_points("reward", [0, 0, 0]))
    assert rules_evaluate() == 1
    assert list(Alert.objects.values_list("run_id", flat=True)) == [run.pk]


# --- API ----------------------------------------------------------------------------------------------


def test_alert_list_filters_and_resolve(team, run):
    events_ingest(run_id=run.pk, events=[NewEvent(kind=EventKind.ALERT, message="stalled")])
    other = run_create(experiment=run.experiment, user=team["member"])
    run_transition(run_id=other.pk, to=RunState.FAILED, error="boom")
    viewer, member = client_for(team["viewer"]), client_for(team["member"])
    assert viewer.get("/api/alerts").json()["count"] == 2
    listed = viewer.get(f"/api/alerts?run={run.pk}&open=1").json()["results"]
    assert [(a["kind"], a["message"], a["open"]) for a in listed] == [("engine", "stalled", True)]
    assert client_for(team["stranger"]).get("/api/alerts").json()["count"] == 0
    alert_id = listed[0]["id"]
    assert viewer.post(f"/api/alerts/{alert_id}/resolve").status_code == 403
    resp = member.post(f"/api/alerts/{alert_id}/resolve")
    assert resp.status_code == 200 and resp.json()["open"] is False
    assert member.post(f"/api/alerts/{alert_id}/resolve").status_code == 200  # idempotent
    assert viewer.get(f"/api/alerts?project={team['project'].pk}&open=1").json()["count"] == 1
    assert viewer.get("/api/alerts?open=0").json()["count"] == 1
    for bad in ("open=2", "run=x", "project=0"):
        resp = viewer.get(f"/api/alerts?{bad}")
        assert resp.status_code == 400 and bad.split("=")[0] in resp.json()["errors"]


def test_rules_crud_with_field_errors(team):
    member, viewer = client_for(team["member"]), client_for(team["viewer"])
    body = {"project": team["project"].pk, "metric": "reward/mean", "kind": "no_improvement", "steps": 50}
    resp = member.post("/api/alert-rules", body, format="json")
    assert resp.status_code == 201, resp.content
    rule = resp.json()
    assert (rule["goal"], rule["active"]) == ("max", True)
    assert viewer.post("/api/alert-rules", body, format="json").status_code == 403
    assert client_for(team["stranger"]).post("/api/alert-rules", body, format="json").status_code == 404
    for field, value in (("steps", 0), ("kind", "nan"), ("goal", "up"), ("metric", "a\x00b"), ("metric", "")):
        resp = member.post("/api/alert-rules", {**body, field: value}, format="json")
        assert resp.status_code == 400 and field in resp.json()["errors"], (field, resp.content)
    resp = member.patch(f"/api/alert-rules/{rule['id']}", {"steps": 5, "goal": "min"}, format="json")
    assert resp.status_code == 200 and (resp.json()["steps"], resp.json()["goal"]) == (5, "min")
    moved = member.patch(
        f"/api/alert-rules/{rule['id']}", {"project": team["other_project"].pk}, format="json"
    )
    assert moved.status_code == 400 and "project" in moved.json()["errors"]
    assert viewer.get(f"/api/alert-rules?project={team['project'].pk}").json()["count"] == 1
    assert member.delete(f"/api/alert-rules/{rule['id']}").status_code == 204
    assert not MetricRule.objects.exists()

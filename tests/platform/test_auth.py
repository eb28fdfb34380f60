"""Authentication: hashed, revocable, expiring tokens; session auth with CSRF; membership rules."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken, Membership, Role
from accounts.services import token_create
from tests.factories import UserFactory, demo_config
from tests.platform.conftest import client_for


@pytest.mark.smoke
def test_a_created_token_shows_its_secret_once_and_stores_only_its_hash(team):
    client = client_for(team["member"])
    resp = client.post("/api/tokens", {"name": "laptop"}, format="json")
    assert resp.status_code == 201
    secret = resp.json()["secret"]
    row = ApiToken.objects.get(pk=resp.json()["id"])
    assert row.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in {str(v) for v in ApiToken.objects.filter(pk=row.pk).values().get().values()}
    assert secret.startswith(row.prefix) and resp.json()["prefix"] == row.prefix
    listed = client.get("/api/tokens").json()
    assert [t["name"] for t in listed] == ["laptop"] and "secret" not in listed[0]
    me = client_for(token=secret).get("/api/me").json()
    assert me["username"] == "member" and me["projects"] == {str(team["project"].pk): "member"}


def test_revoked_expired_and_unknown_tokens_are_401(team):
    issued = token_create(user=team["member"], name="t")
    assert client_for(token=issued.secret).get("/api/projects").status_code == 200
    assert client_for(team["member"]).delete(f"/api/tokens/{issued.token.pk}").status_code == 204
    resp = client_for(token=issued.secret).get("/api/projects")
    assert resp.status_code == 401 and "revoked" in resp.json()["detail"]
    expired = token_create(user=team["member"], name="old", expires_at=timezone.now() - timedelta(seconds=1))
    assert client_for(token=expired.secret).get("/api/projects").status_code == 401
    assert client_for(token="rlp_not-a-real-token").get("/api/projects").status_code == 401
    malformed = APIClient()
    malformed.credentials(HTTP_AUTHORIZATION="Token")
    assert malformed.get("/api/projects").status_code == 401


def test_token_expiry_must_be_in_the_future_and_the_project_visible(team):
    client = client_for(team["member"])
    past = (timezone.now() - timedelta(days=1)).isoformat()
    assert client.post("/api/tokens", {"name": "x", "expires_at": past}, format="json").status_code == 400
    other = team["other_project"].pk
    assert client.post("/api/tokens", {"name": "x", "project": other}, format="json").status_code == 404


def test_anonymous_gets_401_with_a_token_challenge(db):
    resp = APIClient().get("/api/experiments")
    assert resp.status_code == 401 and resp["WWW-Authenticate"] == "Token"


@pytest.mark.smoke
def test_browser_session_needs_the_csrf_token_for_writes(team):
    browser = APIClient(enforce_csrf_checks=True)
    assert browser.login(username="member", password="pw-for-tests")
    assert browser.get("/api/experiments").status_code == 200
    body = {"project": team["project"].pk, "name": "from the browser", "config": demo_config()}
    refused = browser.post("/api/experiments", body, format="json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    browser.get("/admin/login/")  # any page that renders a form sets the csrftoken cookie
    csrf = browser.cookies["csrftoken"].value
    accepted = browser.post("/api/experiments", body, format="json", HTTP_X_CSRFTOKEN=csrf)
    assert accepted.status_code == 201


def test_owner_manages_members_but_cannot_remove_the_last_owner(team):
    owner = client_for(team["owner"])
    pid = team["project"].pk
    invited = owner.post(
        f"/api/projects/{pid}/members", {"username": "stranger", "role": "viewer"}, format="json"
    )
    assert invited.status_code == 202 and invited.json()["role"] == "viewer"
    stranger = client_for(team["stranger"])
    accepted = stranger.post(f"/api/invitations/{invited.json()['id']}/accept")
    assert accepted.status_code == 201 and accepted.json()["role"] == "viewer"
    assert stranger.get(f"/api/projects/{pid}").json()["role"] == "viewer"
    own = Membership.objects.get(project_id=pid, user=team["owner"])
    demote = owner.patch(f"/api/projects/{pid}/members/{own.pk}", {"role": "member"}, format="json")
    assert demote.status_code == 400 and "at least one owner" in demote.json()["errors"]["role"][0]
    assert owner.delete(f"/api/projects/{pid}/members/{own.pk}").status_code == 400
    promote = owner.post(
        f"/api/projects/{pid}/members", {"username": "member", "role": "owner"}, format="json"
    )
    assert promote.status_code == 201
    assert owner.delete(f"/api/projects/{pid}/members/{own.pk}").status_code == 204
    assert not Membership.objects.filter(project_id=pid, user=team["owner"]).exists()
    assert owner.post(f"/api/projects/{pid}/members", {"username": "ghost"}, format="json").status_code == 404


def test_adding_a_member_does_not_tell_an_owner_whether_the_account_exists(team):
    """An owner who is not an administrator gets the same answer for an account that exists and one
    that does not (an invitation); only the invited account sees it, and joins by accepting it."""
    owner, pid = client_for(team["owner"]), team["project"].pk
    answers = [
        owner.post(f"/api/projects/{pid}/members", {"username": name, "role": "member"}, format="json")
        for name in ("stranger", "nobody-by-this-name")
    ]
    assert [a.status_code for a in answers] == [202, 202]
    shapes = [
        {k: v for k, v in a.json().items() if k not in ("id", "username", "created_at")} for a in answers
    ]
    assert shapes[0] == shapes[1]
    assert not Membership.objects.filter(project_id=pid, user=team["stranger"]).exists()
    assert {i["username"] for i in owner.get(f"/api/projects/{pid}/invitations").json()} == {
        "stranger",
        "nobody-by-this-name",
    }
    stranger, member = client_for(team["stranger"]), client_for(team["member"])
    (mine,) = stranger.get("/api/invitations").json()
    assert mine["project"] == pid and member.get("/api/invitations").json() == []
    assert member.post(f"/api/invitations/{mine['id']}/accept").status_code == 404  # not addressed to them
    assert stranger.post(f"/api/invitations/{mine['id']}/accept").status_code == 201
    assert Membership.objects.get(project_id=pid, user=team["stranger"]).role == "member"
    assert stranger.post(f"/api/invitations/{mine['id']}/accept").status_code == 404  # used up


def test_an_administrator_adds_members_directly(team):
    admin = UserFactory(username="admin", is_staff=True)
    Membership.objects.create(project=team["project"], user=admin, role="owner")
    client, pid = client_for(admin), team["project"].pk
    added = client.post(f"/api/projects/{pid}/members", {"username": "stranger"}, format="json")
    assert added.status_code == 201 and Membership.objects.filter(user=team["stranger"]).count() == 2
    ghost = client.post(f"/api/projects/{pid}/members", {"username": "ghost"}, format="json")
    assert ghost.status_code == 400 and "username" in ghost.json()["errors"]


def test_owner_sees_and_revokes_the_projects_tokens(team):
    scoped = token_create(user=team["member"], name="ci", project=team["project"])
    unscoped = token_create(user=team["member"], name="laptop")
    owner = client_for(team["owner"])
    listed = owner.get(f"/api/projects/{team['project'].pk}/tokens").json()
    assert [t["name"] for t in listed] == ["ci"]  # the member's unscoped token is theirs alone
    assert owner.delete(f"/api/projects/{team['project'].pk}/tokens/{unscoped.token.pk}").status_code == 404
    assert owner.delete(f"/api/projects/{team['project'].pk}/tokens/{scoped.token.pk}").status_code == 204
    assert client_for(token=scoped.secret).get("/api/projects").status_code == 401
    assert client_for(token=unscoped.secret).get("/api/projects").status_code == 200


def test_creating_a_project_makes_you_its_owner(team):
    resp = client_for(team["stranger"]).post("/api/projects", {"name": "gamma"}, format="json")
    assert resp.status_code == 201 and resp.json()["role"] == "owner"
    assert Membership.objects.get(project_id=resp.json()["id"]).role == Role.OWNER


def test_a_project_is_deleted_only_without_active_runs(team, experiment):
    from experiments.services import run_create, run_transition
    from tracking.models import MetricPoint, MetricRollup
    from tracking.services import Point, metrics_ingest

    run = run_create(experiment=experiment, user=team["member"])
    metrics_ingest(run_id=run.pk, points=[Point("k", s, 1.0, 0.0) for s in range(40)])
    owner = client_for(team["owner"])
    resp = owner.delete(f"/api/projects/{team['project'].pk}")
    assert resp.status_code == 409 and "active runs" in resp.json()["detail"]
    run_transition(run_id=run.pk, to="cancelled")
    assert owner.delete(f"/api/projects/{team['project'].pk}").status_code == 204
    assert client_for(team["member"]).get(f"/api/runs/{run.pk}").status_code == 404
    # No FK constraint in the database on metric tables: Django's cascade must remove them.
    assert not MetricPoint.objects.filter(run_id=run.pk).exists()
    assert not MetricRollup.objects.filter(run_id=run.pk).exists()

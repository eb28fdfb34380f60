"""Token rules: a project-limited token sees and manages only its scope; a token created with a token is
no broader and lives no longer, and dies with it; a run's ingest token reaches the engine through a
file only the job's user can read, expires with the heartbeat timeout unless heartbeats renew it."""

from __future__ import annotations

import os
import stat
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from accounts.models import ApiToken, Membership
from accounts.services import TokenRuleError, ingest_token_issue, token_create
from experiments.services import run_create, run_heartbeat, run_transition
from tests.platform.conftest import client_for


@pytest.fixture
def two_projects(team):
    """The member also belongs to the other project; one token limited to each, one unlimited."""
    Membership.objects.create(project=team["other_project"], user=team["member"], role="member")
    make = lambda **kw: token_create(user=team["member"], **kw)  # noqa: E731
    return {
        "alpha": make(name="alpha", project=team["project"]),
        "beta": make(name="beta", project=team["other_project"]),
        "all": make(name="all"),
    }


def test_a_project_limited_token_sees_and_revokes_only_tokens_of_its_project(two_projects):
    alpha = client_for(token=two_projects["alpha"].secret)
    assert [t["name"] for t in alpha.get("/api/tokens").json()] == ["alpha"]
    for other in ("beta", "all"):
        pk = two_projects[other].token.pk
        assert alpha.get(f"/api/tokens/{pk}").status_code == 404
        assert alpha.delete(f"/api/tokens/{pk}").status_code == 404
        assert ApiToken.objects.get(pk=pk).revoked_at is None
    unlimited = client_for(token=two_projects["all"].secret)
    assert {t["name"] for t in unlimited.get("/api/tokens").json()} == {"all"}  # a token: only its family
    session = client_for(two_projects["alpha"].token.user)
    assert {t["name"] for t in session.get("/api/tokens").json()} == {"alpha", "beta", "all"}


def test_a_token_manages_only_itself_and_its_descendants_never_its_parent(team):
    """A narrower child (here limited to a project the user owns) neither lists nor revokes its parent,
    nor a sibling; the parent manages the child and the child's own children."""
    owner = team["owner"]
    parent = token_create(user=owner, name="parent", project=team["project"])
    sibling = token_create(user=owner, name="sibling", project=team["project"])
    via_parent = client_for(token=parent.secret)
    child = via_parent.post("/api/tokens", {"name": "child"}, format="json").json()
    via_child = client_for(token=child["secret"])
    grandchild = via_child.post("/api/tokens", {"name": "grandchild"}, format="json").json()
    assert {t["name"] for t in via_child.get("/api/tokens").json()} == {"child", "grandchild"}
    assert {t["name"] for t in via_parent.get("/api/tokens").json()} == {"parent", "child", "grandchild"}
    project_tokens = f"/api/projects/{team['project'].pk}/tokens"
    listed = {t["name"] for t in via_child.get(project_tokens).json()}
    assert "parent" not in listed and "sibling" not in listed and "child" in listed
    for victim in (parent.token, sibling.token):
        assert via_child.get(f"/api/tokens/{victim.pk}").status_code == 404
        assert via_child.delete(f"/api/tokens/{victim.pk}").status_code == 404
        assert via_child.delete(f"{project_tokens}/{victim.pk}").status_code == 404
        victim.refresh_from_db()
        assert victim.revoked_at is None
    assert via_child.delete(f"/api/tokens/{grandchild['id']}").status_code == 204
    assert via_parent.delete(f"{project_tokens}/{child['id']}").status_code == 204
    assert client_for(token=child["secret"]).get("/api/me").status_code == 401
    assert client_for(token=parent.secret).get("/api/me").status_code == 200


def test_a_token_created_with_a_limited_token_is_limited_to_the_same_project(team, two_projects):
    alpha = client_for(token=two_projects["alpha"].secret)
    child = alpha.post("/api/tokens", {"name": "child"}, format="json")
    assert child.status_code == 201 and child.json()["project"] == team["project"].pk
    assert child.json()["parent"] == two_projects["alpha"].token.pk
    wider = alpha.post("/api/tokens", {"name": "x", "project": team["other_project"].pk}, format="json")
    assert wider.status_code == 404  # the other project is not visible through this token
    with pytest.raises(TokenRuleError, match="only create tokens limited to it"):  # nor by the service
        token_create(
            user=team["member"], name="x", project=team["other_project"], parent=two_projects["alpha"].token
        )
    assert client_for(token=child.json()["secret"]).get("/api/projects").json()["count"] == 1


def test_a_token_created_with_a_token_lives_no_longer_than_it(team):
    soon = timezone.now() + timedelta(hours=1)
    parent = token_create(user=team["member"], name="ci", expires_at=soon)
    client = client_for(token=parent.secret)
    child = client.post("/api/tokens", {"name": "child"}, format="json").json()
    assert child["expires_at"] is not None and ApiToken.objects.get(pk=child["id"]).expires_at == soon
    later = (soon + timedelta(days=1)).isoformat()
    resp = client.post("/api/tokens", {"name": "forever", "expires_at": later}, format="json")
    assert resp.status_code == 400 and "expires_at" in resp.json()["errors"]
    session = client_for(team["member"]).post("/api/tokens", {"name": "mine"}, format="json").json()
    assert session["parent"] is None and session["expires_at"] is None  # a session is no token


def test_revoking_a_token_revokes_every_token_created_with_it(team):
    leaked = token_create(user=team["member"], name="leaked")
    child = client_for(token=leaked.secret).post("/api/tokens", {"name": "c"}, format="json").json()
    grandchild = client_for(token=child["secret"]).post("/api/tokens", {"name": "g"}, format="json").json()
    sibling = token_create(user=team["member"], name="unrelated")
    assert client_for(team["member"]).delete(f"/api/tokens/{leaked.token.pk}").status_code == 204
    for secret in (leaked.secret, child["secret"], grandchild["secret"]):
        assert client_for(token=secret).get("/api/me").status_code == 401
    assert client_for(token=sibling.secret).get("/api/me").status_code == 200


def test_an_ingest_token_expires_after_the_heartbeat_timeout_unless_renewed(team, experiment, settings):
    settings.RUN_HEARTBEAT_TIMEOUT_S = 60
    run = run_create(experiment=experiment, user=None)
    issued = ingest_token_issue(run=run)
    lifetime = issued.token.expires_at - timezone.now()
    assert timedelta(seconds=55) < lifetime <= timedelta(seconds=60)
    ApiToken.objects.filter(pk=issued.token.pk).update(expires_at=timezone.now() + timedelta(seconds=5))
    engine = client_for(token=issued.secret)
    assert engine.post(f"/api/runs/{run.pk}/heartbeat").json()["active"] is True  # renews
    assert ApiToken.objects.get(pk=issued.token.pk).expires_at - timezone.now() > timedelta(seconds=55)
    ApiToken.objects.filter(pk=issued.token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert run_heartbeat(run_id=run.pk)  # e.g. the supervisor's heartbeat: an expired token stays expired
    assert engine.post(f"/api/runs/{run.pk}/heartbeat").status_code == 401


def test_an_ingest_token_is_revoked_when_its_run_ends(team, experiment):
    run = run_create(experiment=experiment, user=None)
    issued = ingest_token_issue(run=run)
    run_transition(run_id=run.pk, to="cancelled")
    assert client_for(token=issued.secret).post(f"/api/runs/{run.pk}/heartbeat").status_code == 401


def test_the_ingest_token_reaches_the_engine_in_a_private_file_not_the_jobs_environment(
    team, experiment, settings, tmp_path
):
    from launcher.services import engine_env

    settings.VAR_DIR = tmp_path
    run = run_create(experiment=experiment, user=None)
    secret = ingest_token_issue(run=run).secret
    env = engine_env(run, secret)
    assert not any(secret in value for value in env.values()) and "RL_ENGINE_INGEST_TOKEN" not in env
    path = env["RL_ENGINE_INGEST_TOKEN_FILE"]
    assert Path(path).read_text() == secret
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700

"""The server-rendered pages: who sees what (members only, 404 for others, login for anonymous), and the
data each page hands its script (schema, presets, run state, checkpoints)."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from accounts.models import Role
from accounts.services import project_create
from experiments.form_schema import form_schema
from experiments.services import run_transition
from rl_engine.presets import preset_names
from tests.factories import ExperimentFactory, MembershipFactory, RunFactory, UserFactory
from tracking.services import checkpoint_record

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    owner = UserFactory(username="owner")
    project = project_create(name="alpha", user=owner)
    viewer = MembershipFactory(project=project, role=Role.VIEWER, user=UserFactory(username="viewer")).user
    stranger = UserFactory(username="stranger")
    project_create(name="beta", user=stranger)
    exp = ExperimentFactory(project=project, name="copy-task")
    run = RunFactory(experiment=exp)
    return {
        "owner": owner,
        "viewer": viewer,
        "stranger": stranger,
        "project": project,
        "exp": exp,
        "run": run,
    }


def client_for(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def page_data(resp) -> dict:
    match = re.search(
        r'<script id="page-data" type="application/json">(.*?)</script>', resp.content.decode(), re.S
    )
    assert match, "the page has no page-data block"
    return json.loads(match.group(1))


def urls(w) -> list[str]:
    return ["/", "/experiments/new/", f"/experiments/{w['exp'].pk}/", f"/runs/{w['run'].pk}/", "/compare/"]


def test_anonymous_users_are_sent_to_the_login_page(world):
    for url in urls(world):
        resp = Client().get(url)
        assert resp.status_code == 302 and resp.url.startswith("/accounts/login/?next="), url
    assert Client().get("/accounts/login/").status_code == 200


def test_other_projects_objects_do_not_exist_for_a_stranger(world):
    c = client_for(world["stranger"])
    assert c.get(f"/experiments/{world['exp'].pk}/").status_code == 404
    assert c.get(f"/runs/{world['run'].pk}/").status_code == 404
    assert c.get(f"/experiments/new/?from={world['exp'].pk}").status_code == 404
    home = c.get("/").content.decode()
    assert "copy-task" not in home and "beta" in home
    assert page_data(c.get(f"/compare/?runs={world['run'].pk}"))["runs"] == []


def test_home_lists_the_members_projects_and_experiments(world):
    body = client_for(world["viewer"]).get("/").content.decode()
    assert "alpha" in body and "copy-task" in body and f'href="/experiments/{world["exp"].pk}/"' in body


def test_new_experiment_page_carries_the_projects_form_and_presets(world):
    resp = client_for(world["owner"]).get("/experiments/new/?preset=demo-cpu")
    data = page_data(resp)
    assert data["schema"] == form_schema(world["project"])  # the engine's, narrowed for the project
    assert data["schema"]["x-platform"] == {"project": world["project"].pk}
    assert "trust_remote_code" not in data["schema"]["$defs"]["ModelConfig"]["properties"]
    trainer = data["schema"]["$defs"]["TrainerConfig"]["properties"]
    assert trainer["lr"]["x-essential"] is True  # drawn first
    assert "x-essential" not in trainer["warmup_steps"]
    assert not {"checkpoint_dir", "resume_from"} & set(trainer)  # where a run runs is not the form's
    assert sorted(data["presets"]) == preset_names()
    assert data["start"]["preset"] == "demo-cpu"
    assert data["projects"] == [{"id": world["project"].pk, "name": "alpha"}]


def test_a_viewer_cannot_pick_a_project_to_create_in_and_sees_no_launch_button(world):
    c = client_for(world["viewer"])
    body = c.get("/experiments/new/").content.decode()
    # No project the viewer may create in: the page explains instead of rendering the form.
    assert 'id="page-data"' not in body and "member role" in body
    assert 'data-testid="launch"' not in c.get(f"/experiments/{world['exp'].pk}/").content.decode()
    assert (
        'data-testid="launch"'
        in client_for(world["owner"]).get(f"/experiments/{world['exp'].pk}/").content.decode()
    )


def test_copy_and_edit_starts_the_form_from_the_experiments_config(world):
    data = page_data(client_for(world["owner"]).get(f"/experiments/new/?from={world['exp'].pk}"))
    assert data["start"]["config"] == world["exp"].config
    assert data["start"]["name"] == "copy-task (copy)"


def test_dashboard_hands_its_script_the_run_state_seq_and_checkpoints(world):
    run = world["run"]
    run_transition(run_id=run.pk, to="starting")
    checkpoint_record(run_id=run.pk, step=5, path="/ckpt/step-5", size_bytes=2048)
    data = page_data(client_for(world["viewer"]).get(f"/runs/{run.pk}/"))
    assert data["run"]["state"] == "starting"
    assert data["run"]["last_seq"] == 2  # the status event and the checkpoint event
    assert [(c["step"], c["path"]) for c in data["checkpoints"]] == [(5, "/ckpt/step-5")]
    assert data["can_write"] is False  # a viewer gets no Cancel/Resume buttons
    assert page_data(client_for(world["owner"]).get(f"/runs/{run.pk}/"))["can_write"] is True


# --- fork (issue 22) -----------------------------------------------------------------------------------


def test_a_fork_of_a_fork_hands_its_script_the_runs_it_continues_and_members_the_fork_editor(world):
    from experiments.models import Experiment
    from experiments.services import run_resume
    from tests.factories import checkpoint_path

    def finish_with_checkpoints(run, *steps):
        run_transition(run_id=run.pk, to="failed", error="x")
        run.refresh_from_db()
        return [checkpoint_record(run_id=run.pk, step=s, path=checkpoint_path(run, s)) for s in steps]

    first = world["run"]
    Experiment.objects.filter(pk=first.experiment_id).update(run_counter=first.number)  # the factory's run
    at_4, _ = finish_with_checkpoints(first, 4, 8)
    second = run_resume(run=first, user=None, checkpoint_id=at_4.pk)
    _, at_6 = finish_with_checkpoints(second, 5, 6)
    third = run_resume(run=second, user=None, checkpoint_id=at_6.pk)
    data = page_data(client_for(world["viewer"]).get(f"/runs/{third.pk}/"))
    assert data["lineage"] == [
        {"id": second.pk, "number": second.number, "up_to_step": 6},
        {"id": first.pk, "number": first.number, "up_to_step": 4},
    ]
    assert page_data(client_for(world["viewer"]).get(f"/runs/{first.pk}/"))["lineage"] == []
    checkpoints = page_data(client_for(world["viewer"]).get(f"/runs/{second.pk}/"))["checkpoints"]
    ids = list(second.checkpoints.order_by("-step").values_list("pk", flat=True))
    assert [c["id"] for c in checkpoints] == ids  # what the fork endpoint takes
    assert b"fork-panel" not in client_for(world["viewer"]).get(f"/runs/{first.pk}/").content
    assert b'data-testid="fork-overrides"' in client_for(world["owner"]).get(f"/runs/{first.pk}/").content


def test_the_project_settings_page_shows_webhooks_to_owners_only(world):
    """Members see the page with a note; the owner gets the webhook form and its script; others 404."""
    url = f"/projects/{world['project'].pk}/"
    owner = client_for(world["owner"]).get(url)
    assert owner.status_code == 200
    assert b'data-testid="webhook-form"' in owner.content and b"js/project_webhooks.js" in owner.content
    data = page_data(owner)
    assert data["project"] == world["project"].pk and data["is_owner"] is True
    assert [e["value"] for e in data["events"]] == ["engine", "run_failed", "rule"]
    viewer = client_for(world["viewer"]).get(url)
    assert viewer.status_code == 200 and b'data-testid="webhooks-owners-only"' in viewer.content
    assert b"webhook-form" not in viewer.content and b"project_webhooks.js" not in viewer.content
    assert client_for(world["stranger"]).get(url).status_code == 404
    assert client_for(world["owner"]).get("/projects/999999/").status_code == 404
    home = client_for(world["owner"]).get("/").content.decode()
    assert f'href="{url}"' in home

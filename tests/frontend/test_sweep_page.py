"""The sweep page (issue 22): who sees it, what it hands its script, the experiment page's link to the
sweeps; and the page's pure table/chart helpers (frontend/static/js/sweep_view.js) run in node against
a Python reference."""

from __future__ import annotations

import json
import random
import shutil
import subprocess

import pytest
from django.test import Client

from accounts.models import Role
from accounts.services import project_create
from sweeps.services import SweepSpec, sweep_create
from tests.conftest import REPO_ROOT
from tests.factories import ExperimentFactory, MembershipFactory, UserFactory
from tests.frontend.test_pages import page_data


@pytest.fixture
def world(db):
    owner = UserFactory(username="owner")
    project = project_create(name="alpha", user=owner)
    viewer = MembershipFactory(project=project, role=Role.VIEWER, user=UserFactory(username="viewer")).user
    stranger = UserFactory(username="stranger")
    project_create(name="beta", user=stranger)
    exp = ExperimentFactory(project=project, name="copy-task")
    spec = SweepSpec(name="lr sweep", method="grid", search_space={"trainer.lr": [1e-6, 2e-6]}, metric="m")
    sweep = sweep_create(experiment=exp, user=owner, spec=spec)
    return {"owner": owner, "viewer": viewer, "stranger": stranger, "exp": exp, "sweep": sweep}


def _client(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_the_sweep_page_is_for_members_only(world):
    url = f"/sweeps/{world['sweep'].pk}/"
    resp = Client().get(url)
    assert resp.status_code == 302 and resp.url.startswith("/accounts/login/")
    assert _client(world["stranger"]).get(url).status_code == 404
    viewer = _client(world["viewer"]).get(url)
    assert viewer.status_code == 200
    body = viewer.content.decode()
    assert "lr sweep" in body and 'data-testid="sweep-cancel"' not in body  # a viewer cannot cancel
    assert page_data(viewer) == {
        "sweep_id": world["sweep"].pk,
        "experiment_id": world["exp"].pk,
        "summary": "last",
    }
    assert 'data-testid="sweep-cancel"' in _client(world["owner"]).get(url).content.decode()


def test_the_experiment_page_has_the_sweeps_section_and_the_form_for_members(world):
    url = f"/experiments/{world['exp'].pk}/"
    owner = _client(world["owner"]).get(url).content.decode()
    assert 'data-testid="sweeps"' in owner and 'data-testid="sweep-form"' in owner
    viewer = _client(world["viewer"]).get(url).content.decode()
    assert 'data-testid="sweeps"' in viewer and 'data-testid="sweep-form"' not in viewer


NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="needs node")
def test_the_table_sort_and_scatter_data_match_a_python_reference():
    rng = random.Random(0)
    rows = []
    for i in range(30):
        value = None if rng.random() < 0.2 else round(rng.uniform(-1, 1), 4)
        rows.append({"index": i, "rank": None, "value": value, "last": value, "seed": rng.randint(0, 9),
                     "params": {"lr": rng.choice([1e-6, 3e-6, 1e-5]), "mode": rng.choice(["a", "b"])}})  # fmt: skip
    script = f"""
      import {{ sortRows, scatterData }} from "{REPO_ROOT}/frontend/static/js/sweep_view.js";
      const rows = {json.dumps(rows)};
      console.log(JSON.stringify({{
        last_desc: sortRows(rows, "last", -1).map((r) => r.index),
        seed_asc: sortRows(rows, "seed", 1).map((r) => r.index),
        lr: scatterData(rows, "param:lr".slice(6)),
        mode: scatterData(rows, "mode"),
      }}));
    """
    out = subprocess.run(
        [NODE, "--input-type=module", "-e", script], capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout)
    with_value = [r for r in rows if r["last"] is not None]
    without = [r["index"] for r in rows if r["last"] is None]
    assert (
        got["last_desc"]
        == [r["index"] for r in sorted(with_value, key=lambda r: (-r["last"], r["index"]))] + without
    )
    assert got["seed_asc"] == [r["index"] for r in sorted(rows, key=lambda r: (r["seed"], r["index"]))]
    points = sorted((r["params"]["lr"], r["value"]) for r in with_value)
    assert (
        sorted(zip(got["lr"]["xs"], got["lr"]["ys"], strict=True)) == points and got["lr"]["labels"] is None
    )
    assert got["mode"]["labels"] == ['"a"', '"b"']
    by_label = sorted((0 if r["params"]["mode"] == "a" else 1, r["value"]) for r in with_value)
    assert sorted(zip(got["mode"]["xs"], got["mode"]["ys"], strict=True)) == by_label

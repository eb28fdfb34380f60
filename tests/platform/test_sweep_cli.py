"""``rlp sweep create/show/cancel`` (issue 22) against a live server: the search space from --param and
-f, a refused point as one line naming its field (exit 2), the ranking as the API gives it, cancel. The
CLI runs as a user runs it, a subprocess, with this checkout's client package."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from accounts.services import project_create, token_create
from experiments.models import Run
from sweeps.models import Sweep, SweepRun
from tests.conftest import REPO_ROOT
from tests.factories import ExperimentFactory, UserFactory
from tracking.services import Point, metrics_ingest

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def account(live_server):
    user = UserFactory(username="cli")
    project = project_create(name="cli", user=user)
    exp = ExperimentFactory(project=project, created_by=user)
    return {"url": live_server.url, "token": token_create(user=user, name="cli").secret, "exp": exp}


def rlp(account, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLP_")}
    env |= {"RLP_URL": account["url"], "RLP_TOKEN": account["token"], "RLP_CONFIG_DIR": "/nonexistent-rlp",
            "PYTHONPATH": str(REPO_ROOT / "client")}  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "rlp_client", *args], env=env, input=stdin,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def test_create_show_cancel_a_sweep_from_the_cli(account, tmp_path):
    exp = account["exp"]
    space = tmp_path / "space.yaml"
    space.write_text("pipeline.staleness_threshold: [0, 1]\n")
    code, out, err = rlp(account, "sweep", "create", str(exp.pk), "-f", str(space),
                         "--param", "trainer.lr=[1e-6, 3e-6]", "--max-concurrent", "2", "--seed", "7",
                         "--metric", "reward/mean", "--json")  # fmt: skip
    assert code == 0, err
    created = json.loads(out)
    sweep = Sweep.objects.get(pk=created["id"])
    assert sweep.max_concurrent == 2 and sweep.seed == 7
    params = [m.params for m in SweepRun.objects.filter(sweep=sweep).order_by("index")]
    assert params == [
        {"pipeline.staleness_threshold": s, "trainer.lr": lr} for s in (0, 1) for lr in (1e-6, 3e-6)
    ]

    # A refused point: one line naming the field, exit 2, nothing stored.
    code, out, err = rlp(account, "sweep", "create", str(exp.pk), "--param", "trainer.lr=[1e-6, -1]")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "search_space.trainer.lr" in err and "point 1" in err
    assert Sweep.objects.count() == 1

    # Ranked as the API ranks: by the best value, the run that peaked highest first.
    ids = [m.run_id for m in SweepRun.objects.filter(sweep=sweep).order_by("index")]
    for run_id, values in zip(ids, [[0.1, 0.9, 0.2], [0.5, 0.6], [0.3], []], strict=True):
        metrics_ingest(run_id=run_id, points=[Point("reward/mean", s, v, 0.0) for s, v in enumerate(values)])
    code, out, err = rlp(account, "sweep", "show", str(sweep.pk), "--summary", "best", "--json")
    assert code == 0, err
    assert [r["id"] for r in json.loads(out)["runs"]] == [ids[0], ids[1], ids[2], ids[3]]
    code, out, err = rlp(account, "sweep", "show", str(sweep.pk))
    assert code == 0 and "ranked by the last value of reward/mean" in out
    assert "trainer.lr" in out and "1e-06" in out

    code, out, err = rlp(account, "sweep", "cancel", str(sweep.pk))
    assert code == 0 and f"sweep {sweep.pk}" in out and "cancelled" in out
    assert set(Run.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"cancelled"}
    assert rlp(account, "sweep", "show", "999999")[0] == 4

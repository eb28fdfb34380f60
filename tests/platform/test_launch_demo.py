"""``manage.py launch_demo`` (what ``make demo`` calls): the preset's experiment, as the platform serves it,
and a queued run."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from experiments.models import Experiment, Run
from tests.factories import UserFactory


@pytest.mark.parametrize("preset", ["demo-cpu", "smollm2-arith-cpu"])
def test_the_demo_launches_the_preset_with_its_model_under_the_first_root(db, settings, tmp_path, preset):
    settings.MODEL_ROOTS = [tmp_path / "models"]
    settings.DATA_ROOTS = [tmp_path / "data"]
    owner = UserFactory(username="demo")
    out = StringIO()
    call_command("launch_demo", user="demo", preset=preset, stdout=out)
    run = Run.objects.get()
    assert out.getvalue().strip() == f"/runs/{run.pk}/"
    experiment = Experiment.objects.get(name=preset, project__memberships__user=owner)
    assert run.experiment == experiment and run.state == "queued"
    model_path = Path(experiment.config["model"]["path"])
    assert model_path.parent == tmp_path / "models"
    assert (
        model_path.name
        == {"demo-cpu": "tiny-llama-demo", "smollm2-arith-cpu": "smollm2-135m-instruct"}[preset]
    )
    call_command("launch_demo", user="demo", preset=preset, stdout=StringIO())  # the experiment is reused
    assert Experiment.objects.filter(name=preset).count() == 1 and Run.objects.count() == 2


def test_an_unknown_preset_is_refused(db):
    UserFactory(username="demo")
    with pytest.raises(CommandError):
        call_command("launch_demo", user="demo", preset="nope", stdout=StringIO())

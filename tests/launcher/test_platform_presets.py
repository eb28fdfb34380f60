"""The dataset preset as the platform serves it, launched the way ``make demo`` launches its preset (the
experiment and run services, then the real launcher, Ray job and engine): its generated dataset lands in
the project's own folder under the first data root, and the MLflow and W&B mirrors, given no place by
the config, write into the run's own folder (the platform's path policy), where MLflow's own client
reads the run back."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.conf import settings

from experiments.config_policy import built_place
from experiments.models import Run
from experiments.run_files import run_folder
from rl_engine.config import parse_config
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def served_preset():
    """gsm8k-style-tiny-cpu as /api/presets serves it, made small; its dataset in a folder of its own."""
    from experiments.config_policy import preset_document

    cfg = preset_document("gsm8k-style-tiny-cpu")
    data = Path(cfg["data"]["path"])
    assert data.parent == Path(settings.DATA_ROOTS[0])
    cfg["data"]["path"] = str(data.with_name(f"{data.name}-test-{os.getpid()}"))
    cfg["data"]["synthetic"].update(train_size=32, test_size=4)
    cfg["rollout"]["n"] = 4
    cfg["trainer"].update(total_steps=2, batch_size=16, mini_batch_size=16)
    cfg["logging"] = {"sinks": ["stdout", "mlflow", "wandb"], "wandb": {"mode": "offline"}, "log_every": 1}
    yield cfg
    shutil.rmtree(cfg["data"]["path"], ignore_errors=True)


def test_the_served_dataset_preset_runs_with_its_data_and_trackers_in_the_platforms_places(
    launcher_stack, served_preset
):
    from accounts.services import membership_set
    from experiments.services import experiment_create, run_create
    from tests.factories import ProjectFactory, UserFactory

    user, project = UserFactory(), ProjectFactory()
    membership_set(project=project, user=user, role="member")
    experiment = experiment_create(
        project=project, user=user, name="gsm8k style", config=parse_config(served_preset)
    )
    run = run_create(experiment=experiment, user=user)
    wait_for(lambda: Run.objects.get(pk=run.pk).state in {"succeeded", "failed"}, timeout_s=300,
             interval_s=0.5, message=f"run {run.pk} to end")  # fmt: skip
    run.refresh_from_db()
    assert run.state == "succeeded", (run.error, list(run.events.values_list("message", flat=True))[-30:])

    # generated in the project's own folder under the first data root, not at the name the config gave
    generated = built_place(Path(settings.DATA_ROOTS[0]), project.pk, served_preset["data"]["path"])
    assert (generated / "train.parquet").is_file() and not Path(served_preset["data"]["path"]).exists()
    shutil.rmtree(generated, ignore_errors=True)
    keys = set(run.metric_points.values_list("key", flat=True))
    assert {"reward/mean", "val/pass@1"} <= keys
    assert not run.events.filter(kind="alert").exists()  # both mirrors worked

    folder = run_folder(run)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    [mlflow_run] = client.search_runs([client.get_experiment_by_name("gsm8k-style-tiny-cpu").experiment_id])
    assert mlflow_run.info.status == "FINISHED"
    assert Path(mlflow_run.info.artifact_uri.removeprefix("file://")).is_relative_to(folder)
    assert list((folder / "wandb").glob("wandb/offline-run-*/run-*.wandb"))

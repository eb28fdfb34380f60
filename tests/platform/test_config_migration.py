"""A run created before the config lost its placement fields (rl_engine.config.moved) resumes after it:
migration 0003 drops them from stored experiments and runs, and the launcher's placement then says
where the resumed run checkpoints and which checkpoint it starts from."""

from __future__ import annotations

import copy
import importlib

import pytest
import yaml
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from experiments.models import Experiment, Run, RunState
from experiments.run_files import checkpoint_folder, run_folder
from experiments.services import run_resume
from launcher.services import job_spec, job_spec_file
from rl_engine.cli import load_job
from rl_engine.config import ConfigError
from rl_engine.config.moved import MOVED
from tests.factories import ExperimentFactory, checkpoint_path, stored_demo_config
from tracking.services import checkpoint_record

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("experiments", "0002_initial")]


def _legacy(config: dict, **placement: object) -> dict:
    """``config`` as the platform stored it before the split: every moved field present (defaults
    made explicit), some with the values the launcher and resume wrote."""
    out = copy.deepcopy(config)
    for field in MOVED:
        *parents, last = field.parts
        node = out
        for part in parents:
            node = node[part]
        node[last] = placement.get(field.placement, field.old_default)
    return out


def test_the_migration_drops_the_fields_the_engine_says_moved():
    # It keeps its own copy of the table (the engine's goes in a later release): the same paths.
    migration = importlib.import_module("experiments.migrations.0003_config_without_placement")
    assert tuple(field.parts for field in MOVED) == migration.MOVED_PATHS
    config = _legacy(stored_demo_config())
    assert migration.without_moved(config) == stored_demo_config()
    assert migration.without_moved(["not", "a", "mapping"]) == ["not", "a", "mapping"]


def _migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _historical_run_model():  # type: ignore[no-untyped-def]
    """The run model as the database now holds it (the schema of the migrations applied): rows of an
    older schema are written with it, never with today's model, which may have columns it lacks."""
    loader = MigrationExecutor(connection).loader
    applied = [key for key in loader.applied_migrations if key in loader.graph.nodes]
    return loader.project_state(applied).apps.get_model("experiments", "Run")


def test_a_run_created_before_the_split_resumes_after_it(team, tmp_path):
    _migrate(BEFORE)
    try:
        config = stored_demo_config()
        experiment = ExperimentFactory(project=team["project"], config=_legacy(config), run_counter=1)
        old = _historical_run_model().objects.create(
            experiment_id=experiment.pk, project_id=team["project"].pk, number=1, config=_legacy(config),
            state=RunState.CANCELLED,
        )  # fmt: skip
        # what the old resume stored: the platform's own fields set in the run's frozen config
        old.config = _legacy(config, checkpoint_dir=str(checkpoint_folder(old)), resume_from="/old/ck",
                             jsonl_path="metrics.jsonl", progress_bar=False)  # fmt: skip
        old.save(update_fields=["config"])
        ckpt = checkpoint_record(run_id=old.pk, step=7, path=checkpoint_path(old, 7))
        with pytest.raises(ConfigError, match="moved out of the config"):  # unmigrated, it cannot resume
            run_resume(run=old, user=team["member"])
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    experiment.refresh_from_db()
    run = Run.objects.get(pk=old.pk)
    assert run.inputs is None  # from before runs stored their inputs: resolved at launch
    assert experiment.config == config and run.config == config  # only the moved fields are gone
    resumed = run_resume(run=run, user=team["member"])
    assert resumed.resumed_from_checkpoint_id == ckpt.pk and resumed.config == config

    spec = job_spec(resumed, tmp_path / "token")
    assert spec.placement.resume_from == ckpt.path
    assert spec.placement.checkpoint_dir == str(checkpoint_folder(resumed)) != str(checkpoint_folder(run))
    assert spec.placement.jsonl_file() == str(run_folder(resumed) / "metrics.jsonl")
    # what the job reads: the engine's CLI takes the written spec as it is
    read = load_job(str(job_spec_file(spec, resumed)), [], {})
    assert read.placement == spec.placement and read.config == spec.config
    document = yaml.safe_load((run_folder(resumed) / "job.yaml").read_text())
    assert set(document) == {"config", "placement"}
    assert Experiment.objects.filter(pk=experiment.pk).exists() and Run.objects.count() == 2

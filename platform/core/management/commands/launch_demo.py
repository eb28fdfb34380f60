"""``python manage.py launch_demo``: the demo experiment, launched as a run; prints its dashboard path.

Creates (once) the project "Demo" owned by the demo user and the experiment "demo-cpu" from the engine's
preset, with the tiny model kept under the first model root (VAR_DIR/models by default); then launches a
new run through the same service the API uses. ``make demo`` calls it after the web server and the
worker are up.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.models import Project
from accounts.services import project_create
from experiments.config_policy import platform_preset
from experiments.models import Experiment
from experiments.services import experiment_create, run_create
from rl_engine.config import ExperimentConfig

DEMO_PROJECT = "Demo"
DEMO_EXPERIMENT = "demo-cpu"


def demo_config() -> ExperimentConfig:
    # The tiny model is built under the first model root (absolute: the job's working dir may differ).
    return platform_preset("demo-cpu")


class Command(BaseCommand):
    help = "Launch a run of the demo experiment (creating the demo project and experiment once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", default="demo", help="owner of the demo project")

    def handle(self, *args: object, user: str, **options: object) -> None:
        owner = get_user_model().objects.filter(username=user).first()
        if owner is None:
            raise CommandError(f"no user named {user!r} (create one with `python manage.py createsuperuser`)")
        project = Project.objects.filter(name=DEMO_PROJECT, memberships__user=owner).first()
        if project is None:
            project = project_create(
                name=DEMO_PROJECT, description="The demo experiment of `make demo`.", user=owner
            )
        experiment = Experiment.objects.filter(project=project, name=DEMO_EXPERIMENT).first()
        if experiment is None:
            experiment = experiment_create(
                project=project,
                user=owner,
                name=DEMO_EXPERIMENT,
                config=demo_config(),
                tags=["demo"],
                description="A tiny Llama learns to copy a character with GRPO, fully asynchronous, on CPU.",
            )
        run = run_create(experiment=experiment, user=owner)
        self.stdout.write(f"/runs/{run.pk}/")

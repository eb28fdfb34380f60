"""``python manage.py launch_demo``: the demo experiment, launched as a run; prints its dashboard path.

Creates (once) the project "Demo" owned by the demo user and an experiment named after the preset
(``--preset``, default ``demo-cpu``) from the engine's preset as this platform serves it (its model under
the first model root, VAR_DIR/models by default); then launches a new run through the same service the
API uses. ``make demo`` calls it after the web server and the worker are up.
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
from rl_engine.presets import preset_names

DEMO_PROJECT = "Demo"
DEMO_PRESET = "demo-cpu"
DESCRIPTIONS = {
    "demo-cpu": "A tiny Llama learns to copy a character with GRPO, fully asynchronous, on CPU.",
    "smollm2-arith-cpu": "SmolLM2-135M-Instruct learns arithmetic word problems with GRPO on CPU; "
    "held-out accuracy is evaluated before, during and after training.",
}


def demo_config(preset: str = DEMO_PRESET) -> ExperimentConfig:
    # The model lives under the first model root (absolute: the job's working dir may differ).
    return platform_preset(preset)


class Command(BaseCommand):
    help = "Launch a run of the demo experiment (creating the demo project and experiment once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", default="demo", help="owner of the demo project")
        parser.add_argument("--preset", default=DEMO_PRESET, choices=preset_names(), help="the engine preset")

    def handle(self, *args: object, user: str, preset: str = DEMO_PRESET, **options: object) -> None:
        if preset not in preset_names():
            raise CommandError(f"no preset {preset!r}; choose one of {', '.join(preset_names())}")
        owner = get_user_model().objects.filter(username=user).first()
        if owner is None:
            raise CommandError(f"no user named {user!r} (create one with `python manage.py createsuperuser`)")
        project = Project.objects.filter(name=DEMO_PROJECT, memberships__user=owner).first()
        if project is None:
            project = project_create(
                name=DEMO_PROJECT, description="The demo experiment of `make demo`.", user=owner
            )
        experiment = Experiment.objects.filter(project=project, name=preset).first()
        if experiment is None:
            experiment = experiment_create(
                project=project,
                user=owner,
                name=preset,
                config=demo_config(preset),
                tags=["demo"],
                description=DESCRIPTIONS.get(preset, f"The engine's {preset} preset."),
            )
        run = run_create(experiment=experiment, user=owner)
        self.stdout.write(f"/runs/{run.pk}/")

"""factory-boy factories for the platform's models (real rows in the test database)."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from accounts.models import Membership, Project, Role
from experiments.models import Experiment, Run, RunState
from rl_engine.config import parse_config


def demo_config() -> dict:
    """A small valid config, as an API body carries it (the CPU demo preset as the platform serves it:
    its tiny model under the first model root; shortened)."""
    from experiments.config_policy import preset_document

    cfg = preset_document("demo-cpu")
    cfg["trainer"]["total_steps"] = 3
    return cfg


def stored_demo_config() -> dict:
    """:func:`demo_config` as a row stores it (every default explicit)."""
    return parse_config(demo_config()).model_dump(mode="json")


def checkpoint_path(run, step: int) -> str:
    """Where the engine saves ``run``'s checkpoint of ``step`` (the only place resume accepts)."""
    from experiments.run_files import checkpoint_folder

    return str(checkpoint_folder(run) / f"step-{step}")


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = factory.PostGenerationMethodCall("set_password", "pw-for-tests")

    @factory.post_generation
    def _save(self, create, extracted, **kwargs):
        if create:
            self.save()


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    name = factory.Sequence(lambda n: f"project {n}")
    created_by = factory.SubFactory(UserFactory)


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    project = factory.SubFactory(ProjectFactory)
    user = factory.SubFactory(UserFactory)
    role = Role.MEMBER


class ExperimentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Experiment

    project = factory.SubFactory(ProjectFactory)
    name = factory.Sequence(lambda n: f"experiment {n}")
    tags = factory.LazyFunction(lambda: ["demo"])
    config = factory.LazyFunction(stored_demo_config)


class RunFactory(factory.django.DjangoModelFactory):
    """A run row in any state (for tests of reads); launches go through ``run_create``."""

    class Meta:
        model = Run

    experiment = factory.SubFactory(ExperimentFactory)
    project = factory.SelfAttribute("experiment.project")
    number = factory.Sequence(lambda n: n + 1)
    config = factory.SelfAttribute("experiment.config")
    state = RunState.QUEUED

"""Writes of the experiments app. ``run_transition`` is the one place a run's state changes.

A run's lifecycle is announced (experiments.lifecycle), not handed to the apps above this one: tracking
records the status events, the launcher enqueues its tasks.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import yaml
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from accounts.models import Project
from accounts.services import ingest_tokens_renew, ingest_tokens_revoke_for_run
from experiments.config_policy import (
    CheckpointRefused,
    PermittedConfig,
    check_config,
    check_resume_checkpoint,
)
from experiments.lifecycle import CancelRequested, RunQueued, StateChanged, announce
from experiments.models import ACTIVE_STATES, TERMINAL_STATES, Experiment, Run, RunState
from experiments.selectors import stored_config
from experiments.yaml_io import load_yaml_text
from rl_engine.config import ExperimentConfig, parse_config

if TYPE_CHECKING:
    from tracking.models import Checkpoint


class InvalidTransition(Exception):
    """The run is not in a state from which the requested change is allowed."""

    def __init__(self, run_id: int, current: str, to: str):
        self.run_id, self.current, self.to = run_id, current, to
        super().__init__(f"run {run_id} cannot go from {current} to {to}")


class ExperimentInUse(Exception):
    """The experiment still has active runs."""


class NoCheckpoint(Exception):
    """The run has no checkpoint to resume from."""


# to-state -> states it may be entered from. Anything else is an illegal transition.
ALLOWED_FROM: dict[str, frozenset[str]] = {
    RunState.QUEUED: frozenset({RunState.STARTING}),  # the launcher gives a run back (e.g. no capacity)
    RunState.STARTING: frozenset({RunState.QUEUED}),
    RunState.RUNNING: frozenset({RunState.STARTING}),
    RunState.CANCELLING: frozenset({RunState.STARTING, RunState.RUNNING}),
    RunState.SUCCEEDED: frozenset({RunState.RUNNING, RunState.CANCELLING}),
    RunState.FAILED: frozenset({RunState.QUEUED, RunState.STARTING, RunState.RUNNING, RunState.CANCELLING}),
    RunState.CANCELLED: frozenset(
        {RunState.QUEUED, RunState.STARTING, RunState.RUNNING, RunState.CANCELLING}
    ),
}

# Fields a transition may set alongside the state (what the launcher records as it goes).
TRANSITION_FIELDS = frozenset(
    {"provider", "cluster_address", "ray_job_id", "celery_task_id", "heartbeat_at", "cancel_requested_at"}
)


def stored(cfg: ExperimentConfig) -> dict[str, Any]:
    """The config as a row stores it: every default explicit. ``cfg`` was validated where it came in (the
    API's serializer, the YAML import, a stored row read back: selectors.stored_config), once on each
    way in, not again by each service it passes."""
    return cfg.model_dump(mode="json")


def clean_tags(tags: Any) -> list[str]:
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ValueError("tags must be a list of strings")
    out: list[str] = []
    for t in (t.strip() for t in tags):
        if not t or len(t) > 50:
            raise ValueError("each tag must have 1 to 50 characters")
        if t not in out:
            out.append(t)
    return out


def experiment_create(
    *,
    project: Project,
    user: AbstractBaseUser | None,
    name: str,
    config: ExperimentConfig,
    description: str = "",
    tags: list[str] | None = None,
) -> Experiment:
    """Raises ConfigError for a config the platform's policy refuses."""
    check_config(config, project=project)
    return Experiment.objects.create(
        project=project,
        name=name,
        description=description,
        tags=clean_tags(tags or []),
        config=stored(config),
        created_by=user,
    )


def experiment_update(*, experiment: Experiment, **fields: Any) -> Experiment:
    """Change name/description/tags/config (an ExperimentConfig). Runs keep the config they were
    launched with."""
    if "config" in fields:
        check_config(fields["config"], project=experiment.project)
        fields["config"] = stored(fields["config"])
    if "tags" in fields:
        fields["tags"] = clean_tags(fields["tags"])
    unknown = set(fields) - {"name", "description", "tags", "config"}
    if unknown:
        raise TypeError(f"cannot update {sorted(unknown)}")
    for name, value in fields.items():
        setattr(experiment, name, value)
    # Only the edited columns: a full save would write back a stale run_counter.
    experiment.save(update_fields=[*fields, "updated_at"])
    return experiment


def experiment_clone(
    *, experiment: Experiment, user: AbstractBaseUser | None, name: str | None = None
) -> Experiment:
    return Experiment.objects.create(
        project=experiment.project,
        name=name or f"{experiment.name} (copy)"[:200],
        description=experiment.description,
        tags=list(experiment.tags),
        config=copy.deepcopy(experiment.config),
        created_by=user,
    )


def experiment_delete(*, experiment: Experiment) -> None:
    if experiment.runs.filter(state__in=ACTIVE_STATES).exists():
        raise ExperimentInUse("the experiment has active runs: cancel them first")
    experiment.delete()


def config_from_yaml(text: str) -> ExperimentConfig:
    """Parse YAML text into a validated config. Raises ConfigError with a line number; anchors,
    aliases, deep nesting and oversize documents are refused (experiments.yaml_io)."""
    return parse_config(load_yaml_text(text))


def config_to_yaml(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, sort_keys=False)


def run_create(
    *,
    experiment: Experiment,
    user: AbstractBaseUser | None,
    priority: int = 0,
    resumed_from: Run | None = None,
    resumed_from_checkpoint: Checkpoint | None = None,
    config: ExperimentConfig | PermittedConfig | None = None,
    provider: str = "",
) -> Run:
    """Launch: freeze the config (``config``, else the experiment's) and where its job reads its inputs
    (``PermittedConfig.inputs``) into a queued run, announced as
    :class:`RunQueued` (the launcher enqueues its start once the run is committed). The experiment's
    stored config is read back with the engine's schema (it may predate it) and the platform's policy
    is checked again (the experiment may predate it, or its project's rights changed): ConfigError when
    either refuses; CheckpointRefused when ``resumed_from_checkpoint`` is not this project's to resume.
    A ``PermittedConfig`` of the experiment's project was checked by the caller and is not again."""
    if isinstance(config, PermittedConfig) and config.project_id == experiment.project_id:
        permitted = config
    else:
        raw = config.config if isinstance(config, PermittedConfig) else config
        permitted = check_config(
            raw if raw is not None else stored_config(experiment), project=experiment.project
        )
    if resumed_from_checkpoint is not None:
        check_resume_checkpoint(resumed_from_checkpoint, project=experiment.project)
    with transaction.atomic():
        Experiment.objects.filter(pk=experiment.pk).update(run_counter=F("run_counter") + 1)
        number = Experiment.objects.filter(pk=experiment.pk).values_list("run_counter", flat=True).get()
        run = Run.objects.create(
            experiment=experiment,
            project_id=experiment.project_id,
            number=number,
            config=stored(permitted.config),
            inputs=permitted.inputs.model_dump(mode="json", exclude_none=True),
            state=RunState.QUEUED,
            priority=priority,
            created_by=user,
            queued_at=timezone.now(),
            provider=provider or getattr(settings, "RAY_PROVIDER", "local"),
            resumed_from=resumed_from,
            resumed_from_checkpoint=resumed_from_checkpoint,
        )
        what = f"resumed from run #{resumed_from.number}" if resumed_from else "created"
        if resumed_from_checkpoint is not None:
            what += f" at step {resumed_from_checkpoint.step}"
        announce(StateChanged(run.pk, None, RunState.QUEUED, f"queued ({what})"))
        announce(RunQueued(run.pk))
    return run


def run_transition(
    *,
    run_id: int,
    to: str,
    from_states: set[str] | frozenset[str] | None = None,
    error: str = "",
    **fields: Any,
) -> Run:
    """Move a run to ``to`` with compare-and-set; the one place state changes.

    ``from_states`` narrows the legal source states (e.g. the launcher only starts ``queued`` runs).
    Raises :class:`InvalidTransition` when the current state is not allowed, ``Run.DoesNotExist`` when
    there is no such run. Sets started/finished timestamps and announces :class:`StateChanged` (the
    run's ``status`` event); a run that ends loses its ingest tokens.
    """
    if to not in ALLOWED_FROM:
        raise ValueError(f"unknown run state {to!r}")
    unknown = set(fields) - TRANSITION_FIELDS
    if unknown:
        raise TypeError(f"run_transition cannot set {sorted(unknown)}")
    allowed = ALLOWED_FROM[to] if from_states is None else ALLOWED_FROM[to] & frozenset(from_states)
    with transaction.atomic():
        while True:  # retried only when another writer changed the state between our read and update
            current = Run.objects.filter(pk=run_id).values_list("state", flat=True).get()
            if current not in allowed:
                raise InvalidTransition(run_id, current, to)
            now = timezone.now()
            values: dict[str, Any] = {"state": to, **fields}
            if error:
                values["error"] = error
            if to == RunState.RUNNING:
                values["started_at"] = now
            if to in TERMINAL_STATES:
                values["finished_at"] = now
            if to == RunState.QUEUED:
                values["queued_at"] = now
            if Run.objects.filter(pk=run_id, state=current).update(**values):
                break
        message = f"{current} → {to}" + (f": {error}" if error else "")
        announce(StateChanged(run_id, current, to, message, error))
        if to in TERMINAL_STATES:
            ingest_tokens_revoke_for_run(run_id=run_id)
    return Run.objects.get(pk=run_id)


def run_request_cancel(*, run: Run, user: AbstractBaseUser | None) -> Run:
    """Cancel a run: a queued one is cancelled at once; a starting/running one goes to ``cancelling``,
    announced as :class:`CancelRequested` (the launcher stops its job). Idempotent while cancelling; a
    finished run raises InvalidTransition."""
    who = getattr(user, "username", "") or "system"
    for _ in range(3):  # the state may move (e.g. queued -> starting) between our read and the CAS
        state = Run.objects.filter(pk=run.pk).values_list("state", flat=True).get()
        if state == RunState.CANCELLING:
            return Run.objects.get(pk=run.pk)
        try:
            if state == RunState.QUEUED:
                return run_transition(
                    run_id=run.pk,
                    to=RunState.CANCELLED,
                    from_states={RunState.QUEUED},
                    error=f"cancelled by {who} before it started",
                )
            with transaction.atomic():
                out = run_transition(
                    run_id=run.pk, to=RunState.CANCELLING, cancel_requested_at=timezone.now()
                )
                announce(CancelRequested(run.pk))
            return out
        except InvalidTransition:
            if Run.objects.filter(pk=run.pk, state__in=TERMINAL_STATES).exists():
                raise
    raise InvalidTransition(run.pk, state, RunState.CANCELLING)


def run_heartbeat(*, run_id: int) -> bool:
    """Record that the run is alive (and extend its ingest token's life by the heartbeat timeout).
    False when the run is not active (the caller should stop)."""
    alive = bool(Run.objects.filter(pk=run_id, state__in=ACTIVE_STATES).update(heartbeat_at=timezone.now()))
    if alive:
        ingest_tokens_renew(run_id=run_id)
    return alive


def run_resume(
    *,
    run: Run,
    user: AbstractBaseUser | None,
    priority: int | None = None,
    checkpoint_id: int | None = None,
    config: ExperimentConfig | None = None,
) -> Run:
    """A new run of the same experiment continuing from a checkpoint of ``run``: a resume, or with the
    knobs a fork.

    The new run has its own folder; it resumes from the checkpoint recorded as its
    ``resumed_from_checkpoint`` (the launcher puts it in the job's placement): ``checkpoint_id``, one of
    ``run``'s, else its latest. Its config is ``config`` (a fork's: the parent's with overrides applied,
    ``rl_engine.config.fork_config``), else ``run``'s own. Raises InvalidTransition (the run is active),
    NoCheckpoint, ConfigError (the platform's policy refuses the config) or CheckpointRefused (not one
    of ``run``'s checkpoints, or it lies outside the run's folder)."""
    if run.state not in TERMINAL_STATES:
        raise InvalidTransition(run.pk, run.state, "resumed")
    checkpoints = run.checkpoints.select_related("run")
    if checkpoint_id is not None:
        ckpt = checkpoints.filter(pk=checkpoint_id).first()
        if ckpt is None:  # the same answer for another run's checkpoint and for none at all
            raise CheckpointRefused(f"checkpoint {checkpoint_id} is not one of run {run.pk}'s checkpoints")
    else:
        ckpt = checkpoints.filter(pruned_at=None).order_by("-step").first()
        if ckpt is None:
            raise NoCheckpoint(f"run {run.pk} has no checkpoint to resume from")
    return run_create(
        experiment=run.experiment,
        user=user,
        priority=run.priority if priority is None else priority,
        resumed_from=run,
        resumed_from_checkpoint=ckpt,
        config=config if config is not None else stored_config(run),
        provider=run.provider,
    )

"""A right withdrawn while runs wait in the queue is withdrawn from them too: the launcher checks each
run's stored config against the policy as it stands at launch (issue: an administrator turned
``allow_trust_remote_code`` off with 5 runs queued and all 5 started with it on). The cluster is a
stand-in that records submissions (the launch path on a real Ray head: tests/launcher)."""

from __future__ import annotations

import pytest

from experiments.models import Run, RunState
from experiments.services import run_create, run_transition
from launcher import jobs, services
from tests.factories import ExperimentFactory, demo_config


@pytest.fixture
def submitted(monkeypatch) -> list[dict]:
    calls: list[dict] = []
    monkeypatch.setattr(
        services, "cluster_for", lambda run: services.Cluster("address", "http://ray.invalid")
    )

    def not_found(address: str, sid: str):
        raise jobs.JobNotFound(sid)

    monkeypatch.setattr(jobs, "state", not_found)
    monkeypatch.setattr(jobs, "submit", lambda address, **kw: calls.append(kw) or kw["submission_id"])
    return calls


def _queued(team, config: dict, count: int) -> list[Run]:
    exp = ExperimentFactory(project=team["project"], config=config)
    runs = [run_create(experiment=exp, user=team["member"]) for _ in range(count)]
    for run in runs:
        run_transition(run_id=run.pk, to=RunState.STARTING)
    return runs


def test_runs_queued_with_trust_remote_code_fail_at_launch_once_the_right_is_withdrawn(team, submitted):
    project = team["project"]
    project.allow_trust_remote_code = True
    project.save()
    cfg = demo_config()
    cfg["model"]["trust_remote_code"] = True
    runs = _queued(team, cfg, 5)
    allowed = _queued(team, demo_config(), 1)[0]  # a run that asks for nothing withdrawn

    project.allow_trust_remote_code = False  # what the administrator does meanwhile
    project.save()
    for run in runs:
        assert services.run_launch(run_id=run.pk, owner="t") == RunState.FAILED
        run.refresh_from_db()
        assert run.error.startswith("launch failed: model.trust_remote_code:"), run.error
    assert submitted == []  # nothing reached the cluster
    assert services.run_launch(run_id=allowed.pk, owner="t") == RunState.RUNNING
    assert len(submitted) == 1


def test_a_model_the_operator_no_longer_allows_fails_at_launch(team, submitted, settings):
    settings.ALLOWED_MODELS = ["/models/Qwen2.5-1.5B-Instruct"]
    cfg = demo_config()
    cfg["model"] = {"path": "/models/Qwen2.5-1.5B-Instruct"}
    (run,) = _queued(team, cfg, 1)
    settings.ALLOWED_MODELS = []
    assert services.run_launch(run_id=run.pk, owner="t") == RunState.FAILED
    run.refresh_from_db()
    assert run.error.startswith("launch failed: model.path:"), run.error
    assert submitted == []

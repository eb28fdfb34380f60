"""How many of the product's files a launch passes through: the request (``POST /api/runs`` to the run
queued and its start enqueued) and the launcher's start task (admission, the job's spec and placement,
the submission to a real local Ray head, the run ``running``). Counted by a profiler on the calls made,
after a first launch has imported everything, so the figure is the path's, not the imports'.

A structural budget, like the import-boundary test: a launch that grows past it has grown a layer. The
files are listed when it fails (and by ``-s``; ``WALK_FUNCS=1`` lists the functions too)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from experiments.models import Run, RunState
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = (ROOT / "platform", ROOT / "rl_engine")
# Files, as measured (docs/architecture.md, "A launch"): 26 in the request, 28 in the start task, 34 in all.
# Each is one concern of its own (docs/architecture.md lists them); the ~24 once aimed at would take
# merging some (the config package's five, the live bus and its outbox, the job's environment filter).
# 31 -> 33: the config's parse checks the reward's arguments by building it (the rewards registry and the
# reward's own module), so a wrong argument is a 400 at create rather than a failed job. 33 -> 34: the
# config's env section (rl_engine/config/env.py: multi-turn episodes) is checked on every parse.
LAUNCH_BUDGET = 34


def files_entered(action: Callable[[], Any]) -> tuple[Any, set[str]]:
    """``action()``'s result and the product files (relative paths) whose functions it called, migrations
    aside."""
    seen: set[str] = set()
    functions = bool(os.environ.get("WALK_FUNCS"))

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen.add(frame.f_code.co_filename)
            if functions:
                seen.add(frame.f_code.co_filename + "::" + frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        result = action()
    finally:
        sys.setprofile(None)
    product = set()
    for name in seen:
        path = Path(name.split("::")[0])
        if any(path.is_relative_to(root) for root in PRODUCT) and "migrations" not in path.parts:
            product.add(str(path.relative_to(ROOT)) + ("::" + name.split("::")[1] if "::" in name else ""))
    return result, product


@pytest.fixture
def local_head(tmp_path, settings):
    from launcher import jobs, ray_local

    settings.RAY_LOCAL_DIR = str(tmp_path / "ray")  # a head of this test's own
    settings.RAY_LOCAL_NUM_CPUS = 2
    settings.RUN_CONCURRENCY_LIMIT_PER_PROJECT = 8
    head = ray_local.ensure_started()
    try:
        yield head
    finally:
        jobs.stop_all(head.dashboard_url, timeout=15)
        ray_local.stop()


def test_a_launch_passes_through_at_most_its_budget_of_files(local_head, monkeypatch):
    from launcher import tasks
    from tests.factories import ProjectFactory, UserFactory
    from tests.launcher.engine_runs import tiny_config
    from tests.platform.conftest import client_for

    enqueued: list[tuple[str, int]] = []
    for name in ("start_run", "supervise_run", "schedule_runs"):  # the worker's part: run here, in turn
        task = getattr(tasks, name)
        monkeypatch.setattr(task, "delay", lambda *a, _n=name: enqueued.append((_n, *a)))
        # the web's enqueue is one bounded try (launcher.lifecycle): apply_async(args, retry=False)
        monkeypatch.setattr(task, "apply_async", lambda args=(), _n=name, **_: enqueued.append((_n, *args)))
    from accounts.services import membership_set
    from experiments.services import experiment_create
    from rl_engine.config import parse_config

    member, project = UserFactory(), ProjectFactory()
    membership_set(project=project, user=member, role="member")
    exp = experiment_create(
        project=project, user=member, name="walk", config=parse_config(tiny_config(steps=1))
    )
    api = client_for(member)
    assert settings.MODEL_ROOTS  # the tiny model builds under the first root

    def post() -> int:
        resp = api.post("/api/runs", {"experiment": exp.pk}, format="json")
        assert resp.status_code == 201, resp.content
        return resp.json()["id"]

    def launch(run_id: int) -> str:
        return tasks.start_run(run_id)

    figures = []
    for _ in range(2):  # the first imports what the path uses; the second is the path
        enqueued.clear()
        run_id, request_files = files_entered(post)
        assert ("start_run", run_id) in enqueued
        state, launch_files = files_entered(lambda: launch(run_id))  # noqa: B023 - called at once
        assert state == RunState.RUNNING, Run.objects.get(pk=run_id).error
        wait_for(lambda: Run.objects.get(pk=run_id).ray_job_id, timeout_s=5, message="a job id")  # noqa: B023
        figures.append((request_files, launch_files))
    request_files, launch_files = figures[-1]
    walked = sorted(request_files | launch_files)
    print(f"\na launch: {len(request_files)} files in the request, {len(launch_files)} in the start task, "
          f"{len(walked)} in all:\n  " + "\n  ".join(walked))  # fmt: skip
    assert len(walked) <= LAUNCH_BUDGET, walked

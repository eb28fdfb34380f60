"""The web UI in a real browser against a real server: log in, create an experiment from the demo preset
through the schema-driven form (its essentials first, every other section folded; a bad value first: its
error appears next to its field, in a folded section too), launch it, and watch a run dashboard draw
metrics ingested through the API and follow status changes live."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest
from playwright.sync_api import expect

from accounts.services import ingest_token_issue, project_create
from experiments.models import Experiment, Run
from experiments.services import run_transition
from rl_engine.config import parse_config
from tests.e2e.conftest import login, screenshot_dir
from tests.factories import ExperimentFactory, RunFactory, UserFactory, checkpoint_path
from tracking.services import events_append

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def post_json(base_url: str, path: str, token: str, body: dict) -> dict:
    req = urllib.request.Request(
        base_url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Token {token}"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def points(steps: range, t0: float) -> list[dict]:
    """A few namespaced series the way the engine reports them (a learning curve, a loss, lag, timings)."""
    out = []
    for s in steps:
        out += [
            {"key": "reward/mean", "step": s, "value": min(0.95, 0.05 + 0.07 * s), "wall_time": t0 + s},
            {"key": "actor/pg_loss", "step": s, "value": 0.4 / (1 + s) - 0.02, "wall_time": t0 + s},
            {"key": "actor/entropy", "step": s, "value": 2.5 - 0.1 * s, "wall_time": t0 + s},
            {"key": "actor/approx_kl", "step": s, "value": 2e-4 * (1 + 0.1 * s), "wall_time": t0 + s},
            {"key": "async/staleness_mean", "step": s, "value": 1.0 + (s % 3) * 0.5, "wall_time": t0 + s},
            {"key": "timing/gen_s", "step": s, "value": 0.8 + 0.05 * (s % 4), "wall_time": t0 + s},
        ]
    return out


def as_worker(fn, **kwargs):
    """Call a service the way the launcher's Celery worker does: from a thread with no event loop (this one
    runs Playwright's), so that its after-commit publish reaches the live bus. On the in-process
    bus of the embedded default that publish cannot reach the server process, and the dashboard must
    learn of the change through the consumer's database poll; with Redis it arrives through the bus."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    def call():
        try:
            return fn(**kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


def field(page, path: str):
    return page.locator(f'[data-path="{path}"]')


@pytest.mark.smoke  # the demo's path in the browser: the embedded pass runs it too
def test_create_experiment_from_the_demo_preset_with_a_field_error_first_then_launch(
    page, asgi_server, tmp_path
):
    user = UserFactory(username="alice")
    project = project_create(name="vision", user=user)
    login(page, "alice")
    page.goto("/experiments/new/")
    expect(page.locator('[data-preset="demo-cpu"]')).to_have_class(re.compile(r"\bactive\b"))
    expect(page.locator('[id="f-rollout.backend"]')).to_have_value("hf")
    page.screenshot(path=str(screenshot_dir(tmp_path) / "experiment_form.png"))

    # A discriminated union swaps its fields: data.source jsonl asks for a path, task does not.
    page.select_option('[id="f-data.source"]', "jsonl")
    expect(field(page, "data.path")).to_be_visible()
    expect(field(page, "data.task")).to_have_count(0)
    page.select_option('[id="f-data.source"]', "task")
    expect(field(page, "data.task")).to_be_visible()

    # A cross-field check has no single field: it goes above the form and marks the fields it names.
    page.fill("#exp-name", "demo from the form")
    page.fill('[id="f-rollout.n"]', "6")
    page.click("[data-testid=create-experiment]")
    expect(page.get_by_test_id("form-errors")).to_contain_text("must be a multiple of rollout.n")
    for path in ("trainer.batch_size", "rollout.n"):
        expect(field(page, path)).to_have_class(re.compile(r"\bhas-error\b"))
    page.fill('[id="f-rollout.n"]', "8")

    # Out of bounds: the server's error lands next to the field, and nothing is created.
    page.fill('[id="f-trainer.lr"]', "0")
    page.click("[data-testid=create-experiment]")
    expect(page.get_by_test_id("form-errors")).to_be_hidden()
    expect(field(page, "trainer.lr").locator(".sf-error")).to_contain_text("greater than 0")
    expect(field(page, "trainer.lr")).to_have_class(re.compile(r"\bhas-error\b"))
    assert not Experiment.objects.exists()
    page.screenshot(path=str(screenshot_dir(tmp_path) / "experiment_form_error.png"), full_page=False)

    # Fix it; change a folded field after opening its section; edit another value through the YAML view.
    page.fill('[id="f-trainer.lr"]', "0.001")
    expect(page.locator('[id="f-rollout.temperature"]')).to_be_hidden()
    page.click('[data-path="rollout"] > summary')
    page.fill('[id="f-rollout.temperature"]', "0.9")
    page.click("[data-testid=view-yaml]")
    text = page.input_value("[data-testid=yaml-editor]")
    assert "temperature: 0.9" in text and "backend: hf" in text and "lr: 0.001" in text
    page.fill("[data-testid=yaml-editor]", re.sub(r"total_steps: \d+", "total_steps: 7", text))
    page.click("[data-testid=view-form]")
    expect(page.locator('[id="f-trainer.total_steps"]')).to_have_value("7")

    page.click("[data-testid=create-experiment]")
    page.wait_for_url(re.compile(r"/experiments/\d+/$"))
    exp = Experiment.objects.get()
    assert (exp.name, exp.project_id) == ("demo from the form", project.pk)
    assert exp.config["rollout"]["temperature"] == 0.9 and exp.config["trainer"]["lr"] == 0.001
    assert exp.config["trainer"]["total_steps"] == 7
    assert exp.config["model"]["tiny"]["hidden_size"] > 0  # the preset's nested object came through
    expect(page.get_by_test_id("experiment-name")).to_have_text("demo from the form")
    page.goto("/")
    expect(page.get_by_test_id("project")).to_contain_text("demo from the form")
    page.screenshot(path=str(screenshot_dir(tmp_path) / "home.png"))
    page.goto(f"/experiments/{exp.pk}/")

    page.click("[data-testid=launch]")
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get()
    assert run.experiment_id == exp.pk and run.config["trainer"]["total_steps"] == 7
    expect(page.get_by_test_id("run-state")).to_have_text(re.compile("queued|starting|running"))
    assert page.js_errors == []


def open_the_form(page, username: str, project: str) -> None:
    """A new user with a project of their own, on the new-experiment page."""
    project_create(name=project, user=UserFactory(username=username))
    login(page, username)
    page.goto("/experiments/new/")


ESSENTIALS = ["model.path", "rollout.backend", "rollout.n", "rollout.max_new_tokens", "trainer.total_steps",
              "trainer.batch_size", "trainer.mini_batch_size", "trainer.lr", "algorithm.advantage", "pipeline.mode",
              "pipeline.staleness_threshold", "data.source", "data.task", "data.num_prompts", "reward.name"]  # fmt: skip


def test_a_new_user_creates_and_launches_a_run_from_a_preset_without_unfolding_anything(
    page, asgi_server, tmp_path
):
    """The essentials (model, data, algorithm, the main trainer and pipeline knobs) come first and open;
    every other section is folded, and none needs opening to go from a preset to a launched run. Where a
    run runs (checkpoint folder, resume, cluster, log and tracker locations) is not in the form at all."""
    open_the_form(page, "nina", "first steps")
    page.click('[data-preset="demo-cpu"]')
    essentials = page.get_by_test_id("essentials")
    for path in ESSENTIALS:
        expect(essentials.locator(f'[data-path="{path}"]')).to_be_visible()
    expect(essentials.locator("[data-path]")).to_have_count(len(ESSENTIALS))
    sections = page.locator("#schema-form details.sf-section")
    assert sections.count() >= 9
    expect(page.locator("#schema-form details.sf-section[open]")).to_have_count(0)
    for moved in ("checkpoint_dir", "resume_from", "ray_address", "jsonl_path", "progress_bar", "artifact_location",
                  "wandb.dir"):  # fmt: skip
        expect(page.locator(f'#schema-form [data-path$="{moved}"]')).to_have_count(0)
    for path in ("trainer.lr", "pipeline.mode"):  # each field is drawn once: not again in its folded section
        expect(page.locator(f'#schema-form [data-path="{path}"]')).to_have_count(1)
    page.screenshot(path=str(screenshot_dir(tmp_path) / "experiment_form_essentials.png"), full_page=True)

    page.check("#launch-after")
    page.click("[data-testid=create-experiment]")
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get()
    served = page.request.get("/api/presets/demo-cpu").json()
    assert run.experiment.name == "demo-cpu" and run.config == parse_config(served).model_dump(mode="json")
    expect(page.get_by_test_id("run-state")).to_have_text(re.compile("queued|starting|running"))
    assert page.js_errors == []


def test_the_queue_bound_check_shows_its_message_at_its_field(page, asgi_server):
    """A rule the engine checks across sections (the queue must hold a generate call and a trainer pull)
    is the config's own validator: the API answers it at pipeline.queue_max_size, and the form shows it
    there, opening the folded section that holds the field."""
    open_the_form(page, "omar", "queues")
    page.click("[data-testid=view-yaml]")
    text = page.input_value("[data-testid=yaml-editor]")
    assert "  queue_max_size: 0\n" in text  # the form shows every default
    page.fill("[data-testid=yaml-editor]", text.replace("  queue_max_size: 0\n", "  queue_max_size: 8\n"))
    page.click("[data-testid=create-experiment]")
    bound = field(page, "pipeline.queue_max_size")
    expect(bound.locator(".sf-error")).to_contain_text("must be 0 or at least 64 samples")
    expect(bound).to_have_class(re.compile(r"\bhas-error\b"))
    expect(bound).to_be_visible()
    expect(page.locator('details[data-path="pipeline"]')).to_have_attribute("open", "")
    expect(page.get_by_test_id("form-errors")).to_be_hidden()
    assert not Experiment.objects.exists()
    assert page.js_errors == []


@pytest.mark.smoke  # live updates on the in-process bus and the poll: the embedded pass runs it too
def test_dashboard_draws_ingested_metrics_live_and_follows_status(page, asgi_server, tmp_path):
    user = UserFactory(username="bob")
    project = project_create(name="rl", user=user)
    run = RunFactory(experiment=ExperimentFactory(project=project, name="copy-task"), created_by=user)
    as_worker(
        events_append,
        run_id=run.pk,
        kind="status",
        message="queued (created)",
        data={"from": None, "to": "queued"},
    )
    token = ingest_token_issue(run=run).secret
    login(page, "bob")
    page.goto(f"/runs/{run.pk}/")
    badge = page.get_by_test_id("run-state")
    expect(badge).to_have_text("queued")
    expect(page.locator("#live-text")).to_have_text("live")
    expect(page.locator("#charts[data-history=loaded]")).to_have_count(1)
    expect(page.locator(".chart")).to_have_count(0)

    # Points ingested after the page loaded reach the charts through the websocket.
    t0 = time.time()
    post_json(asgi_server.url, f"/api/runs/{run.pk}/metrics", token, {"points": points(range(1, 7), t0)})
    expect(page.locator('[data-metric="reward/mean"]')).to_have_attribute("data-points", "6")
    for ns in ("reward", "actor", "async", "timing"):
        expect(page.locator(f'[data-group="{ns}"]')).to_be_visible()

    # A status change made outside the web server (as the launcher's worker does) shows up on the badge.
    as_worker(run_transition, run_id=run.pk, to="starting")
    as_worker(run_transition, run_id=run.pk, to="running")
    expect(badge).to_have_text("running")
    expect(page.locator('#timeline [data-step="running"]')).to_have_class(re.compile(r"\bcurrent\b"))

    post_json(asgi_server.url, f"/api/runs/{run.pk}/metrics", token, {"points": points(range(7, 15), t0)})
    post_json(
        asgi_server.url,
        f"/api/runs/{run.pk}/events",
        token,
        {"events": [{"kind": "log", "message": "step 14: reward 0.95"}]},
    )
    post_json(
        asgi_server.url,
        f"/api/runs/{run.pk}/samples",
        token,
        {
            "step": 14,
            "samples": [
                {
                    "prompt": "copy: q",
                    "response": "q",
                    "answer": "q",
                    "reward": 1.0,
                    "param_version_start": 13,
                    "param_version_end": 14,
                    "reward_parts": {"reasoning_gym": 1.0, "format": 0.25},
                }
            ],
        },
    )
    expect(page.locator('[data-metric="reward/mean"]')).to_have_attribute("data-points", "14")
    expect(page.get_by_test_id("log-tail")).to_contain_text("step 14: reward 0.95")
    expect(page.locator("#progress-step")).to_have_text("14")
    page.click("#samples-refresh")
    expect(page.get_by_test_id("samples")).to_contain_text("copy: q")
    # each reward component's score beside the reward, by label
    expect(page.get_by_test_id("reward-parts").locator("li")).to_have_text(["format 0.25", "reasoning_gym 1"])
    page.screenshot(path=str(screenshot_dir(tmp_path) / "run_dashboard.png"), full_page=True)

    # Cancel (two clicks: the first one arms the button) goes through the API to the run's state.
    page.click("[data-testid=cancel]")
    page.click("[data-testid=cancel]")
    expect(badge).to_have_text("cancelling")
    assert Run.objects.get(pk=run.pk).state == "cancelling"
    assert page.js_errors == []


def test_resume_from_a_checkpoint_then_compare_the_two_runs(page, asgi_server, tmp_path):
    user = UserFactory(username="erin")
    project = project_create(name="rl", user=user)
    exp = ExperimentFactory(project=project, name="copy-task", run_counter=1)  # run #1 is the factory's
    first = RunFactory(experiment=exp, number=1, created_by=user)
    token = ingest_token_issue(run=first).secret
    as_worker(run_transition, run_id=first.pk, to="starting")
    as_worker(run_transition, run_id=first.pk, to="running")
    post_json(
        asgi_server.url, f"/api/runs/{first.pk}/metrics", token, {"points": points(range(1, 11), time.time())}
    )
    login(page, "erin")
    page.goto(f"/runs/{first.pk}/")
    ckpt = checkpoint_path(first, 10)  # where the engine saves it: the only place resume accepts
    expect(page.get_by_test_id("checkpoints")).not_to_contain_text("step-10")
    # A checkpoint reported by the engine appears in the list as it happens.
    post_json(
        asgi_server.url,
        f"/api/runs/{first.pk}/events",
        token,
        {
            "events": [
                {
                    "kind": "checkpoint",
                    "message": "checkpoint at step 10",
                    "data": {"step": 10, "path": ckpt},
                }
            ]
        },
    )
    expect(page.get_by_test_id("checkpoints")).to_contain_text(ckpt)
    expect(page.get_by_test_id("resume")).to_be_hidden()
    as_worker(run_transition, run_id=first.pk, to="succeeded")
    expect(page.get_by_test_id("run-state")).to_have_text("succeeded")
    expect(page.get_by_test_id("resume")).to_be_enabled()
    expect(page.get_by_test_id("cancel")).to_be_hidden()

    page.click("[data-testid=resume]")
    page.wait_for_url(re.compile(rf"/runs/(?!{first.pk}/)\d+/$"))
    second = Run.objects.exclude(pk=first.pk).get()
    assert page.url.endswith(f"/runs/{second.pk}/")
    assert second.number == 2 and second.resumed_from_id == first.pk and second.config == first.config
    assert second.resumed_from_checkpoint.path == ckpt  # the launcher's placement resumes from it
    expect(page.get_by_test_id("run-state")).to_have_text(re.compile("queued|starting|running"))

    # The experiment page follows the state of its active runs.
    page.goto(f"/experiments/{first.experiment_id}/")
    row = page.locator(f'tr[data-run-id="{second.pk}"] [data-field=state]')
    expect(row).to_have_text("queued")
    as_worker(run_transition, run_id=second.pk, to="cancelled")
    expect(row).to_have_text("cancelled")

    page.goto(f"/compare/?runs={first.pk},{second.pk}&key=reward/mean")
    expect(page.locator("#compare-title")).to_have_text("reward/mean")
    legend = page.locator("#compare-chart .u-legend")
    expect(legend).to_contain_text("copy-task #1")
    expect(legend).to_contain_text("copy-task #2")
    expect(page.locator("#compare-note")).to_contain_text("no reward/mean yet: copy-task #2")
    expect(page.locator("#compare-runs option")).to_have_count(2)
    # A resumed run runs its parent's config: the config diff says so (tests/e2e/test_compare_config_diff.py).
    expect(page.locator("#diff-note")).to_have_text("The runs' configs are identical.")
    expect(page.get_by_test_id("config-diff").locator("tbody tr")).to_have_count(0)
    page.screenshot(path=str(screenshot_dir(tmp_path) / "compare.png"), full_page=False)
    assert page.js_errors == []


def test_strangers_get_404_and_anonymous_users_the_login_page(page, asgi_server):
    owner = UserFactory(username="carol")
    run = RunFactory(experiment=ExperimentFactory(project=project_create(name="p", user=owner)))
    UserFactory(username="dave")
    resp = page.goto(f"/runs/{run.pk}/")
    assert "/accounts/login/" in page.url and resp.status == 200
    login(page, "dave")
    resp = page.goto(f"/runs/{run.pk}/")
    assert resp.status == 404


# --- fork (issue 22) -----------------------------------------------------------------------------------


def test_fork_from_a_checkpoint_with_an_override_then_the_new_run_continues_the_parents_curve(
    page, asgi_server, tmp_path
):
    from tracking.services import checkpoint_record

    user = UserFactory(username="fran")
    project = project_create(name="rl", user=user)
    exp = ExperimentFactory(project=project, name="copy-task", run_counter=1)
    first = RunFactory(experiment=exp, number=1, created_by=user)
    token = ingest_token_issue(run=first).secret
    as_worker(run_transition, run_id=first.pk, to="starting")
    as_worker(run_transition, run_id=first.pk, to="running")
    post_json(
        asgi_server.url, f"/api/runs/{first.pk}/metrics", token, {"points": points(range(1, 11), time.time())}
    )
    as_worker(checkpoint_record, run_id=first.pk, step=10, path=checkpoint_path(first, 10))
    login(page, "fran")
    page.goto(f"/runs/{first.pk}/")
    # A checkpoint the engine reports live gets its button too (its id is looked up when it is used),
    # enabled once the run has finished.
    post_json(
        asgi_server.url,
        f"/api/runs/{first.pk}/events",
        token,
        {
            "events": [
                {
                    "kind": "checkpoint",
                    "message": "c",
                    "data": {"step": 4, "path": checkpoint_path(first, 4)},
                }
            ]
        },
    )
    expect(page.get_by_test_id("fork-4")).to_be_disabled()
    as_worker(run_transition, run_id=first.pk, to="succeeded")
    expect(page.get_by_test_id("run-state")).to_have_text("succeeded")
    expect(page.get_by_test_id("fork-4")).to_be_enabled()
    expect(page.get_by_test_id("fork-10")).to_be_enabled()
    at_4 = first.checkpoints.get(step=4)
    expect(page.get_by_test_id("fork-panel")).to_be_hidden()

    page.click("[data-testid=fork-4]")
    expect(page.get_by_test_id("fork-panel")).to_be_visible()
    expect(page.locator("#fork-title")).to_have_text("Fork from step 4")
    editor = page.get_by_test_id("fork-overrides")
    for text, path in [
        ("trainer:\n  lr: -1\n", "config_overrides.trainer.lr"),
        ("trainer:\n  lrr: 1.0e-6\n", "config_overrides.trainer.lrr"),
        ("model:\n  dtype: bfloat16\n", "config_overrides.model.dtype"),
        ("trainer: [1\n", "not valid YAML"),
    ]:
        editor.fill(text)
        page.click("[data-testid=fork-submit]")
        expect(page.get_by_test_id("fork-errors")).to_contain_text(path)
    assert Run.objects.count() == 1

    editor.fill("trainer:\n  lr: 5.0e-7\nalgorithm:\n  kl_coef: 0.01\n")
    page.click("[data-testid=fork-submit]")
    page.wait_for_url(re.compile(rf"/runs/(?!{first.pk}/)\d+/$"))
    fork = Run.objects.exclude(pk=first.pk).get()
    assert page.url.endswith(f"/runs/{fork.pk}/")
    assert fork.resumed_from_id == first.pk and fork.resumed_from_checkpoint_id == at_4.pk
    assert fork.config["trainer"]["lr"] == 5e-7 and fork.config["algorithm"]["kl_coef"] == 0.01
    expect(page.get_by_test_id("run-state")).to_have_text(re.compile("queued|starting|running"))
    # The parent's curve up to the fork's checkpoint, then the fork's own points as they arrive.
    chart = page.locator('[data-metric="reward/mean"]')
    expect(chart).to_have_attribute("data-earlier-points", "4")
    fork_token = ingest_token_issue(run=fork).secret
    as_worker(run_transition, run_id=fork.pk, to="starting")
    as_worker(run_transition, run_id=fork.pk, to="running")
    expect(page.locator("#charts")).to_have_attribute("data-history", "loaded")
    post_json(
        asgi_server.url,
        f"/api/runs/{fork.pk}/metrics",
        fork_token,
        {"points": points(range(5, 8), time.time())},
    )
    expect(chart).to_have_attribute("data-points", "3")
    expect(chart).to_have_attribute("data-earlier-points", "4")
    page.screenshot(path=str(screenshot_dir(tmp_path) / "fork.png"), full_page=False)
    assert page.js_errors == []

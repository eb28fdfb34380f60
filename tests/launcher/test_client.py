"""The Python client (client/rlp_client) and the ``rlp`` CLI against the real stack: the web server
(daphne), a Celery worker with its beat, a Ray head running the engine, the test database. Nothing is
mocked; the database is the reference every answer is compared with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from experiments.models import Run
from tests.conftest import REPO_ROOT
from tests.launcher.engine_runs import db_points, tiny_config
from tests.launcher.test_run_lifecycle import no_job_outlives_its_test, state_of, wait_reporting, wait_state

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["no_job_outlives_its_test"]  # the autouse fixture: no engine outlives its test


@pytest.fixture
def account(launcher_stack):
    """A member of a fresh project with a user token, a stranger with theirs, the stack's URL."""
    from accounts.services import membership_set, project_create, token_create
    from tests.factories import ProjectFactory, UserFactory

    user, stranger = UserFactory(), UserFactory()
    project = ProjectFactory()
    membership_set(project=project, user=user, role="member")
    project_create(name=f"{stranger.username}'s", user=stranger)
    return {
        "url": launcher_stack.web.url,
        "user": user,
        "project": project,
        "token": token_create(user=user, name="client tests").secret,
        "stranger_token": token_create(user=stranger, name="client tests").secret,
    }


def experiment_for(account, steps: int, **trainer):
    from experiments.services import experiment_create
    from rl_engine.config import parse_config

    return experiment_create(project=account["project"], user=account["user"], name=f"client {steps}",
                             config=parse_config(tiny_config(steps=steps, **trainer)))  # fmt: skip


def rlp(account, *args: str, token: str | None = None):
    """``python -m rlp_client ARGS`` in a child process; (exit code, stdout, stderr). The login itself:
    tests/platform/test_login_cli.py."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLP_")}
    env |= {"RLP_URL": account["url"], "RLP_TOKEN": token or account["token"]}
    env["RLP_CONFIG_DIR"] = str(Path(os.environ.get("TMPDIR", "/tmp")) / "rlp-unused")
    proc = subprocess.run([sys.executable, "-m", "rlp_client", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def db_events(run: Run) -> list[tuple[int, str, str]]:
    return list(run.events.order_by("seq").values_list("seq", "kind", "message"))


# --- the library -------------------------------------------------------------------------------------


def test_follow_a_run_to_its_end_through_a_server_restart_losing_and_repeating_nothing(
    account, launcher_stack
):
    from rlp_client import Client, Event, MetricPoint

    client = Client(account["url"], account["token"])
    run = client.launch(experiment_for(account, steps=40).pk, priority=3)
    assert run.state == "queued" and run.info.priority == 3
    stream = run.follow()
    points, events, restarted = [], [], False
    for item in stream:
        if isinstance(item, MetricPoint):
            points.append(item)
        else:
            assert isinstance(item, Event)
            events.append(item)
        if not restarted and len(points) >= 10 and stream.state.state == "running":
            launcher_stack.web.stop()  # the socket drops mid-run; the engine spools meanwhile
            launcher_stack.web.start()
            restarted = True
    assert restarted and stream.state.reconnects >= 1
    assert stream.state.state == "succeeded" == run.wait()
    db_run = Run.objects.get(pk=run.id)
    followed = [(p.key, p.step, p.value) for p in points]
    assert len(set((k, s) for k, s, _ in followed)) == len(followed)  # nothing repeated
    assert sorted(followed) == sorted(db_points(db_run))  # nothing lost: the database's points, exactly
    assert max(s for _, s, _ in followed) >= 39
    assert [(e.seq, e.kind, e.message) for e in events] == db_events(db_run)  # every event once, in order
    states = [e.new_state for e in events if e.new_state]
    assert states == ["queued", "starting", "running", "succeeded"]
    # The REST reads agree with the same database.
    assert {p.key for p in points} == set(run.metric_keys())
    series = {s.key: s for s in run.metrics(max_points=100_000)}
    assert sorted(
        (k, st, v) for k, s in series.items() for st, v in zip(s.steps, s.values, strict=False)
    ) == sorted(followed)
    assert [e.seq for e in run.events()] == [e.seq for e in events]


def test_the_socket_refuses_a_stranger_with_4403_and_a_bad_token_with_4401(account):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from accounts.services import token_create, token_revoke
    from rlp_client import Client, StreamRefused
    from rlp_client.live import LiveStream
    from tests.factories import RunFactory

    run_id = RunFactory(
        experiment=experiment_for(account, steps=2), state="succeeded"
    ).pk  # nothing to launch
    revoked = token_create(user=account["user"], name="soon revoked")
    token_revoke(token=revoked.token)
    ws_url = account["url"].replace("http", "ws", 1) + f"/ws/runs/{run_id}/"
    for token, code in ((account["stranger_token"], 4403), (revoked.secret, 4401), ("rlp_nonsense", 4401)):
        # What the server sends: the handshake completes, then a close frame with the code.
        with (
            connect(
                ws_url, additional_headers={"Authorization": f"Token {token}"}, origin=account["url"]
            ) as ws,
            pytest.raises(ConnectionClosed) as closed,
        ):
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == code, token
        # What the client makes of it: StreamRefused with the code, no reconnect loop.
        transport = Client(account["url"], token).transport  # the socket alone, no REST call first
        with pytest.raises(StreamRefused) as info:
            next(iter(LiveStream(transport, run_id)))
        assert info.value.code == code, token
    with connect(
        ws_url, additional_headers={"Authorization": f"Token {account['token']}"}, origin=account["url"]
    ) as ws:
        assert json.loads(ws.recv(timeout=10))["kind"] == "hello"  # the member's token is admitted


# --- the CLI -----------------------------------------------------------------------------------------


def test_cli_models_shows_what_the_api_answers(account):
    import httpx

    api = httpx.get(f"{account['url']}/api/models", headers={"Authorization": f"Token {account['token']}"})
    assert api.status_code == 200
    code, out, err = rlp(account, "models", "--json")
    assert code == 0, err
    assert json.loads(out) == api.json()
    code, out, err = rlp(account, "models")
    assert code == 0, err
    names = [m["name"] for m in api.json()["models"]] + [u["name"] for u in api.json()["not_fetched"]]
    assert names and all(name in out for name in names), out


def test_cli_create_export_launch_follow_metrics_list(account, tmp_path):
    from experiments.models import Experiment

    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(yaml.safe_dump(tiny_config(steps=2)))
    code, out, err = rlp(account, "experiment", "create", "-f", str(exp_file), "--project", account["project"].name,
                         "--set", "trainer.total_steps=4", "--set", "trainer.lr=2e-5", "--json")  # fmt: skip
    assert code == 0, err
    exp = Experiment.objects.get(pk=json.loads(out)["id"])
    assert exp.name == "exp" and exp.project == account["project"]
    assert exp.config["trainer"]["total_steps"] == 4 and exp.config["trainer"]["lr"] == 2e-5

    code, out, err = rlp(account, "experiment", "export", str(exp.pk), "-o", str(tmp_path / "out.yaml"))
    assert code == 0, err
    assert yaml.safe_load((tmp_path / "out.yaml").read_text()) == exp.config
    code, out, err = rlp(account, "experiment", "export", str(exp.pk))
    assert code == 0 and yaml.safe_load(out) == exp.config

    code, out, err = rlp(account, "run", "launch", str(exp.pk), "--priority", "5", "--follow", "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["type"] == "end" and lines[-1]["state"] == "succeeded"
    run = Run.objects.get(pk=lines[-1]["run"])
    assert run.priority == 5 and run.state == "succeeded"
    followed = sorted((d["key"], d["step"], d["value"]) for d in lines if d["type"] == "metric")
    assert followed == sorted(db_points(run))
    assert [(d["seq"], d["kind"], d["message"]) for d in lines if d["type"] == "event"] == db_events(run)

    code, out, err = rlp(account, "run", "metrics", str(run.pk), "--keys", "reward/mean", "--format", "csv")
    assert code == 0, err
    rows = [line.split(",") for line in out.strip().splitlines()]
    assert rows[0] == ["key", "step", "value", "wall_time"]
    expected = sorted((s, v) for k, s, v in db_points(run) if k == "reward/mean")
    assert sorted((int(r[1]), float(r[2])) for r in rows[1:]) == expected and expected
    code, out, err = rlp(account, "run", "metrics", str(run.pk), "--format", "json")
    assert code == 0, err
    assert sorted((p["key"], p["step"], p["value"]) for p in json.loads(out)["points"]) == sorted(
        db_points(run)
    )

    # Human follow of a finished run: the whole log, then the final state; exit code as `run wait`.
    code, out, err = rlp(account, "run", "follow", str(run.pk))
    assert code == 0, err
    assert out.strip().splitlines()[-1] == f"run {run.pk} succeeded"
    code, out, err = rlp(account, "run", "wait", str(run.pk))
    assert code == 0, err


@pytest.mark.extended  # ~1.5 min; cancel and resume run in CI through tests/launcher/test_run_lifecycle.py
def test_cli_wait_cancel_resume_and_the_exit_codes_of_each_final_state(account):
    exp = experiment_for(account, steps=2000)
    code, out, err = rlp(account, "run", "launch", str(exp.pk), "--json")
    assert code == 0, err
    run_id = json.loads(out)["id"]
    wait_reporting(run_id, min_points=10, timeout_s=400)  # a loaded machine starts the engine slowly
    code, out, err = rlp(account, "run", "list", "--state", "running", "--json")
    assert code == 0, err
    assert [r["id"] for r in json.loads(out)] == list(
        Run.objects.filter(state="running", project=account["project"]).values_list("id", flat=True)
    ) == [run_id]  # fmt: skip
    code, out, err = rlp(account, "run", "cancel", str(run_id), "--json")
    assert code == 0 and json.loads(out)["state"] in ("cancelling", "cancelled"), err
    code, out, err = rlp(account, "run", "wait", str(run_id), "--poll", "0.5")
    assert code == 2, err  # cancelled
    assert state_of(run_id) == "cancelled"
    code, out, err = rlp(account, "run", "cancel", str(run_id))
    assert code == 4 and "(HTTP 409)" in one_line(err)

    code, out, err = rlp(account, "run", "resume", str(run_id), "--json")
    assert code == 0, err
    resumed = json.loads(out)
    assert resumed["resumed_from"] == run_id
    checkpoint = Run.objects.get(pk=run_id).checkpoints.order_by("-step").first()
    assert Run.objects.get(pk=resumed["id"]).resumed_from_checkpoint_id == checkpoint.pk
    wait_reporting(resumed["id"], timeout_s=400)
    assert rlp(account, "run", "cancel", str(resumed["id"]))[0] == 0
    wait_state(resumed["id"], "cancelled", timeout_s=30)

    # failed: exit 1 (a failed run's row; how it failed does not matter to `wait`)
    from tests.factories import RunFactory

    failed = RunFactory(experiment=exp, number=99, state="failed", error="test: the engine crashed")
    code, out, err = rlp(account, "run", "wait", str(failed.pk), "--json")
    assert code == 1 and json.loads(out)["error"] == "test: the engine crashed", err


def test_cli_bad_input_is_one_line_naming_the_field_exit_2(account, tmp_path):
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(yaml.safe_dump(tiny_config(steps=2)))
    cases = [
        (
            (
                "experiment",
                "create",
                "-f",
                str(exp_file),
                "--project",
                str(account["project"].pk),
                "--set",
                "trainer.lr=-1",
            ),
            "trainer.lr",
        ),
        (("experiment", "create", "-f", str(exp_file), "--project", "1", "--set", "nonsense"), "--set"),
        (("experiment", "create", "-f", str(tmp_path / "missing.yaml"), "--project", "1"), "-f"),
        (("run", "launch", "seven"), "experiment"),
        (("run", "launch", "1", "--priority", "high"), "--priority"),
        (("run", "list", "--state", "sleeping"), "--state"),
        (("run", "metrics", "1", "--format", "xml"), "--format"),
    ]
    for args, field in cases:
        code, _, err = rlp(account, *args)
        assert code == 2, (args, err)
        assert field in one_line(err), (args, err)
    exp = experiment_for(account, steps=2)
    code, _, err = rlp(account, "run", "launch", str(exp.pk), "--priority", "5000")
    assert code == 2 and "priority" in one_line(err)
    assert not Run.objects.filter(experiment=exp).exists()  # refused whole
    code, _, err = rlp(account, "run", "show", "999999")
    assert code == 4 and "(HTTP 404)" in one_line(err)
    from tests.factories import RunFactory

    foreign = RunFactory(experiment=exp, state="succeeded")
    code, _out, err = rlp(account, "run", "show", str(foreign.pk), token=account["stranger_token"])
    assert code == 4 and "(HTTP 404)" in one_line(err)  # another project's run: as if it did not exist


# --- fork (issue 22) -----------------------------------------------------------------------------------


@pytest.mark.extended  # a real run; the fork path runs in CI through test_run_lifecycle's fork test
def test_cli_fork_sends_the_checkpoint_and_the_overrides_and_names_a_refused_field(account, tmp_path):
    from tests.factories import RunFactory, checkpoint_path
    from tracking.services import checkpoint_record

    exp = experiment_for(account, steps=2)
    parent = RunFactory(
        experiment=exp, number=50, state="failed", config=exp.config, created_by=account["user"]
    )
    at_1 = checkpoint_record(run_id=parent.pk, step=1, path=checkpoint_path(parent, 1))
    checkpoint_record(run_id=parent.pk, step=2, path=checkpoint_path(parent, 2))
    code, _, err = rlp(account, "run", "fork", str(parent.pk), "--set", "trainer.lr=-1")
    assert code == 2 and "config_overrides.trainer.lr" in one_line(err)
    code, _, err = rlp(account, "run", "fork", str(parent.pk), "--checkpoint", "nine")
    assert code == 2 and "--checkpoint" in one_line(err)
    assert not Run.objects.filter(resumed_from=parent).exists()

    overrides = tmp_path / "over.yaml"
    overrides.write_text("algorithm:\n  kl_coef: 0.01\n")
    args = ("run", "fork", str(parent.pk), "--checkpoint", str(at_1.pk), "-f", str(overrides))
    code, out, err = rlp(account, *args, "--set", "trainer.lr=5e-7", "--json")
    assert code == 0, err
    fork = Run.objects.get(pk=json.loads(out)["id"])
    assert fork.resumed_from_id == parent.pk and fork.resumed_from_checkpoint_id == at_1.pk
    assert fork.config["trainer"]["lr"] == 5e-7 and fork.config["algorithm"]["kl_coef"] == 0.01
    # the checkpoint is a row only (no engine wrote it): stop the fork whatever it got to
    from tests.conftest import wait_for

    rlp(account, "run", "cancel", str(fork.pk))
    wait_for(lambda: state_of(fork.pk) in ("failed", "cancelled"), timeout_s=60, message="the fork to end")

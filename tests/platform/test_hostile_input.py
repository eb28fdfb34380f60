"""Input meant to hurt the web process: alias bombs, deep nesting, oversize bodies, malformed checkpoint
events, engine events posing as state changes, spreadsheet formulas in exports. Each is a 400/413 with the
field path (never a 500), and nothing is stored."""

from __future__ import annotations

import csv
import importlib
import io
import json
import os
from types import SimpleNamespace

import pytest
import yaml

from accounts.services import ingest_token_issue
from experiments.models import Experiment
from experiments.services import run_create
from tests.factories import checkpoint_path, demo_config
from tests.platform.conftest import client_for
from tracking.models import Checkpoint, RunEvent
from tracking.services import Point, metrics_ingest


def billion_laughs(levels: int = 7) -> str:
    """The classic alias bomb inside a config: 9**levels strings from ~450 bytes."""
    lines = [
        "model: {path: m}",
        "reward:",
        "  kwargs:",
        '    l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    ]
    for i in range(1, levels):
        lines.append(f"    l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def import_yaml(team, text: str):
    body = {"project": team["project"].pk, "name": "imported", "yaml": text}
    return client_for(team["member"]).post("/api/experiments/import", body, format="json")


def test_the_billion_laughs_document_is_refused_at_its_first_anchor(team):
    text = billion_laughs()
    assert len(text.encode()) <= 448
    resp = import_yaml(team, text)
    assert resp.status_code == 400
    (message,) = resp.json()["errors"]["yaml"]
    # Refused where the first anchor stands (line 4): nothing after it was parsed, let alone expanded.
    assert "anchors (&l0) are not allowed" in message and "line 4" in message
    assert not Experiment.objects.exists()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("model: {path: m}\nreward: {kwargs: {x: *nowhere}}\n", "aliases"),
        ("model: {path: m}\nreward: {kwargs: {x: " + "[" * 200 + "]" * 200 + "}}\n", "nesting deeper"),
        ("model:\n  path: [unclosed\n", "not valid YAML (line"),
    ],
)
def test_aliases_deep_nesting_and_bad_yaml_are_a_400_saying_why(team, text, why):
    resp = import_yaml(team, text)
    assert resp.status_code == 400 and why in resp.json()["errors"]["yaml"][0]


def test_a_yaml_document_over_the_size_limit_is_refused_before_parsing(team, settings):
    settings.YAML_IMPORT_MAX_BYTES = 1000
    resp = import_yaml(team, "model: {path: m}\n" + "# padding\n" * 200)
    assert resp.status_code == 400 and "the limit is 1000 bytes" in resp.json()["errors"]["yaml"][0]


@pytest.fixture
def run(team, experiment):
    return run_create(experiment=experiment, user=team["member"])


@pytest.fixture
def engine(run):
    return client_for(token=ingest_token_issue(run=run).secret)


def post_events(client, run, events):
    return client.post(f"/api/runs/{run.pk}/events", {"events": events}, format="json")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"step": "abc", "path": "P"}, "events[1].data.step"),
        ({"step": 2**70, "path": "P"}, "events[1].data.step"),
        ({"step": -1, "path": "P"}, "events[1].data.step"),
        ({"step": 12.5, "path": "P"}, "events[1].data.step"),
        ({"step": 3, "path": 7}, "events[1].data.path"),
        ({"step": 3}, "events[1].data.path"),
        ({"step": 3, "path": "P", "size_bytes": "big"}, "events[1].data.size_bytes"),
        ({"step": 3, "path": "/etc/cron.d/evil"}, "events[1].data.path"),
    ],
)
def test_a_malformed_checkpoint_event_is_a_400_naming_the_field(run, engine, data, field):
    data = {k: (checkpoint_path(run, 3) if v == "P" else v) for k, v in data.items()}
    before = RunEvent.objects.filter(run=run).count()
    resp = post_events(engine, run, [{"kind": "log", "message": "ok"}, {"kind": "checkpoint", "data": data}])
    assert resp.status_code == 400, resp.content
    assert field in resp.json()["errors"], resp.json()
    assert RunEvent.objects.filter(run=run).count() == before and not Checkpoint.objects.exists()


def test_a_well_formed_checkpoint_event_is_recorded(run, engine):
    data = {"step": 3, "path": checkpoint_path(run, 3), "size_bytes": 10, "extra": "kept"}
    assert post_events(engine, run, [{"kind": "checkpoint", "data": data}]).status_code == 201
    assert list(Checkpoint.objects.filter(run=run).values_list("step", "path")) == [(3, data["path"])]


def test_engine_status_events_cannot_say_which_state_the_run_entered(run, engine):
    forged = [{"kind": "status", "message": "done", "data": {"from": "running", "to": "succeeded"}}]
    resp = post_events(engine, run, forged)
    assert resp.status_code == 400
    assert {"events[0].data.from", "events[0].data.to"} <= set(resp.json()["errors"])
    assert not RunEvent.objects.filter(run=run, kind="status", data__to="succeeded").exists()
    # What the engine really sends (informational) is accepted.
    note = [{"kind": "status", "message": "pipeline running", "data": {"step": 0, "mode": "fully_async"}}]
    assert post_events(engine, run, note).status_code == 201


def test_deeply_nested_json_is_a_400_not_a_recursion_error(team, run, engine):
    deep = '{"events": [{"kind": "log", "data": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}]}"
    resp = engine.generic("POST", f"/api/runs/{run.pk}/events", deep, content_type="application/json")
    assert resp.status_code == 400 and "nested deeper" in resp.json()["detail"]
    cfg = demo_config()
    cfg["reward"]["kwargs"] = json.loads("[" * 70 + "]" * 70)  # fine for json, too deep for the platform
    body = {"project": team["project"].pk, "name": "deep", "config": cfg}
    resp = client_for(team["member"]).post("/api/experiments", body, format="json")
    assert resp.status_code == 400 and "nested deeper than 64" in resp.json()["detail"]


def test_a_body_over_the_upload_limit_is_a_413(run, engine, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 50_000
    big = [{"kind": "log", "message": "x" * 1000} for _ in range(100)]
    resp = post_events(engine, run, big)
    assert resp.status_code == 413 and "50000 bytes" in resp.json()["detail"]
    assert not RunEvent.objects.filter(run=run, kind="log").exists()


def test_csv_export_escapes_cells_a_spreadsheet_would_run_as_formulas(team, run):
    keys = ['=HYPERLINK("http://evil")', "+1", "@SUM(A1)", "-2", "reward/mean"]
    metrics_ingest(run_id=run.pk, points=[Point(k, 1, -0.5, 1.0) for k in keys])
    text = b"".join(
        client_for(team["viewer"]).get(f"/api/runs/{run.pk}/metrics/export/csv").streaming_content
    )
    rows = list(csv.reader(io.StringIO(text.decode())))[1:]
    assert sorted(r[0] for r in rows) == sorted(["'" + k for k in keys[:4]] + ["reward/mean"])
    assert {r[2] for r in rows} == {"-0.5"}  # numbers are ours, never escaped


# --- free-form JSON: one check for JSON and YAML (rl_engine.safe_json) -----------------------------------------


def raw_post(client, url: str, text: str):
    return client.generic("POST", url, text, content_type="application/json")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"events": [{"kind": "log", "data": {"x": [1, 1e400]}}]}', "events[0].data.x[1]"),
        ('{"events": [{"kind": "log", "data": {"x": -1e400}}]}', "events[0].data.x"),
        ('{"events": [{"kind": "log", "message": "a\\ud800b"}]}', "events[0].message"),
        ('{"events": [{"kind": "log", "data": {"k": {"s": "\\udc00"}}}]}', "events[0].data.k.s"),
        ('{"events": [{"kind": "log", "data": {"\\ud800": 1}}]}', "events[0].data.\ufffd"),
        ('{"events": [{"kind": "log", "data": {"s": "a\\u0000"}}]}', "events[0].data.s"),
    ],
)
def test_event_data_a_store_cannot_hold_is_a_400_naming_the_field(run, engine, body, field):
    resp = raw_post(engine, f"/api/runs/{run.pk}/events", body)
    assert resp.status_code == 400, resp.content
    assert field in resp.json()["errors"], resp.json()
    assert not RunEvent.objects.filter(run=run, kind="log").exists()


def test_sample_text_with_a_lone_surrogate_is_a_400(run, engine):
    body = '{"step": 1, "samples": [{"prompt": "p", "response": "\\ud83d"}]}'
    resp = raw_post(engine, f"/api/runs/{run.pk}/samples", body)
    assert resp.status_code == 400 and "samples[0].response" in resp.json()["errors"]
    # A real pair is one character, and fine.
    body = '{"step": 1, "samples": [{"prompt": "p", "response": "\\ud83d\\ude00"}]}'
    assert raw_post(engine, f"/api/runs/{run.pk}/samples", body).status_code == 201


def config_text(field: str, literal: str, dump) -> str:
    """A valid config as text (``dump``: json.dumps or yaml.safe_dump) with ``literal`` at ``field``."""
    cfg = demo_config()
    *parents, last = field.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = "PLACEHOLDER"
    return dump(cfg).replace('"PLACEHOLDER"', literal).replace("PLACEHOLDER", literal)


def test_a_json_config_with_a_number_beyond_the_float_range_is_a_400(team):
    config = config_text("algorithm.kl_coef", "1e400", json.dumps)
    text = f'{{"project": {team["project"].pk}, "name": "x", "config": {config}}}'
    resp = raw_post(client_for(team["member"]), "/api/experiments", text)
    assert resp.status_code == 400 and "config.algorithm.kl_coef" in resp.json()["errors"], resp.content
    assert not Experiment.objects.exists()


@pytest.mark.parametrize(
    ("field", "literal"),
    [
        ("algorithm.kl_coef", ".inf"),
        ("algorithm.kl_coef", "-.inf"),
        ("trainer.weight_decay", ".nan"),
        ("reward.kwargs.note", '"a\\0b"'),
        ("reward.kwargs.note", '"\\ud800"'),
        ("reward.kwargs.when", "2024-01-01"),
        ("reward.kwargs.blob", "!!binary aGk="),
    ],
)
def test_yaml_values_a_store_cannot_hold_are_a_400_naming_the_field(team, field, literal):
    text = config_text(field, literal, yaml.safe_dump)
    assert literal in text
    resp = import_yaml(team, text)
    assert resp.status_code == 400, resp.content
    errors = resp.json()["errors"]
    assert any(key.endswith(field) for key in errors), errors
    assert not Experiment.objects.exists()


def test_a_yaml_body_holding_lone_surrogates_is_a_400(team):
    yaml_text = "model: {path: m}\\nname: \\ud800\\n"  # as JSON text: the escape, not the character
    text = f'{{"project": {team["project"].pk}, "name": "x", "yaml": "{yaml_text}"}}'
    resp = raw_post(client_for(team["member"]), "/api/experiments/import", text)
    assert resp.status_code == 400 and "yaml" in resp.json()["errors"]


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")), reason="PostgreSQL's jsonb refuses these values on insert"
)
def test_rows_stored_before_the_check_still_list_and_the_migration_repairs_them(team, run):
    """The embedded database stored lone surrogates in JSON columns (escaped, as ``\\ud800``); a run
    holding one listed with a 500 for everyone. The renderer lists it, the data migration repairs it."""
    bad = RunEvent.objects.create(run=run, seq=99, kind="log", data={"s": "a\ud800", "k\udc00": ["\ud83d"]})
    resp = client_for(team["viewer"]).get(f"/api/runs/{run.pk}/events")
    assert resp.status_code == 200
    (shown,) = [e for e in resp.json()["events"] if e["seq"] == 99]
    assert shown["data"] == {"s": "a\ufffd", "k\ufffd": ["\ufffd"]}

    from django.apps import apps
    from django.db import connection

    migration = importlib.import_module("core.migrations.0002_repair_stored_json")
    migration.repair_stored_json(apps, SimpleNamespace(connection=connection))  # all it reads of the editor
    bad.refresh_from_db()
    assert bad.data == {"s": "a\ufffd", "k\ufffd": ["\ufffd"]}


# --- what PyYAML or a column cannot take: a 400 at the field, never a 500 ----------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("model: {path: m}\nname: a\u0003\n", "U+0003 is not allowed (line 2, column 8)"),
        ("model: {path: m}\nseed: " + "1" * 5_000 + "\n", "an integer of 5000 characters"),
        ("model: {path: m}\nseed: 0x" + "f" * 20_000 + "\n", "an integer of 20002 characters"),
        ("model: {path: m}\nseed: 0b" + "1" * 60_000 + "\n", "an integer of 60002 characters"),
        ("model: {path: m}\nseed: " + ":".join(["59"] * 30_000) + "\n", "characters is not allowed"),
        ("model: {path: m}\nreward: {kwargs: {when: 2024-02-30}}\n", "'2024-02-30' cannot be read"),
    ],
    ids=["control character", "5000 digits", "20000 hex digits", "60000 binary digits", "base 60", "no date"],
)
def test_yaml_that_pyyaml_or_python_cannot_read_is_a_400_saying_where(team, text, words):
    resp = import_yaml(team, text)
    assert resp.status_code == 400, resp.content
    (message,) = resp.json()["errors"]["yaml"]
    assert words in message and "line" in message
    assert not Experiment.objects.exists()


@pytest.mark.parametrize("seed", [-1, 2**63, 2**70])
def test_a_seed_torch_or_a_bigint_column_cannot_take_is_a_400_at_the_field(team, seed):
    member = client_for(team["member"])
    cfg = {**demo_config(), "seed": seed}
    resp = member.post(
        "/api/experiments", {"project": team["project"].pk, "name": "x", "config": cfg}, format="json"
    )
    assert resp.status_code == 400 and "config.seed" in resp.json()["errors"], resp.content
    resp = import_yaml(team, yaml.safe_dump(cfg))
    assert resp.status_code == 400 and "yaml.seed" in resp.json()["errors"], resp.content
    assert not Experiment.objects.exists()


def test_a_fork_with_a_seed_beyond_the_bound_is_a_400_at_the_override(team, run):
    from experiments.services import run_transition
    from tracking.services import checkpoint_record

    run_transition(run_id=run.pk, to="failed", error="x")
    checkpoint_record(run_id=run.pk, step=1, path=checkpoint_path(run, 1))
    resp = client_for(team["member"]).post(
        f"/api/runs/{run.pk}/fork", {"config_overrides": {"seed": 2**70}}, format="json"
    )
    assert resp.status_code == 400 and "config_overrides.seed" in resp.json()["errors"], resp.content


@pytest.mark.parametrize(
    ("method", "space", "field"),
    [
        ("grid", {"seed": [2**63]}, "search_space.seed"),
        ("random", {"seed": "int(-1e308, 1e308)"}, "search_space.seed"),
        ("random", {"model.tiny.seed": {"int": [2**63, 2**64]}}, "search_space.model.tiny.seed"),
        ("random", {"algorithm.kl_coef": "uniform(-1e308, 1e308)"}, "search_space.algorithm.kl_coef"),
        ("random", {"trainer.lr": {"uniform": [0, 10**400]}}, "search_space.trainer.lr"),
    ],
)
def test_a_sweep_whose_points_overflow_a_column_or_a_float_is_a_400_at_the_field(
    team, experiment, method, space, field
):
    from sweeps.models import Sweep, SweepRun

    body = {
        "experiment": experiment.pk,
        "metric": "m",
        "method": method,
        "search_space": space,
        "max_runs": 2,
    }
    resp = client_for(team["member"]).post("/api/sweeps", body, format="json")
    assert resp.status_code == 400, resp.content
    assert field in resp.json()["errors"], resp.json()
    assert not Sweep.objects.exists() and not SweepRun.objects.exists()

"""GET /api/runs/compare: the config fields that differ between runs, from each run's stored config
(validated, else as stored), with every bad ``ids`` a 400 at ``ids`` and runs of other projects a 404."""

from __future__ import annotations

import copy
import json

import pytest
from drf_spectacular.generators import SchemaGenerator

from experiments.services import run_create
from tests.factories import ExperimentFactory, RunFactory, demo_config, stored_demo_config
from tests.platform.conftest import client_for


def with_lr(config: dict, lr: float) -> dict:
    out = copy.deepcopy(config)
    out["trainer"]["lr"] = lr
    return out


def launched(team, config: dict, name: str):
    """A run launched the platform's way: its experiment's config frozen into it."""
    exp = ExperimentFactory(project=team["project"], name=name, config=config)
    return run_create(experiment=exp, user=team["member"])


def compare(client, ids) -> dict:
    resp = client.get("/api/runs/compare", {"ids": ",".join(map(str, ids))})
    assert resp.status_code == 200, resp.content[:500]
    return resp.json()


def test_lists_the_fields_that_differ_with_each_runs_value_and_not_the_equal_ones(team):
    base = stored_demo_config()
    a = launched(team, with_lr(base, 1e-6), "slow")
    b = launched(team, with_lr(base, 3e-6), "fast")
    c = launched(team, with_lr(base, 1e-6), "slow again")
    body = compare(client_for(team["viewer"]), [b.pk, a.pk, c.pk])

    assert [r["id"] for r in body["runs"]] == [b.pk, a.pk, c.pk]  # the order asked for
    assert body["runs"][0] == {
        "id": b.pk,
        "number": 1,
        "label": "fast #1",
        "state": "queued",
        "experiment": {"id": b.experiment_id, "name": "fast"},
        "project": {"id": team["project"].pk, "name": "alpha"},
        "config_basis": "validated",
        "config_problem": None,
    }
    assert body["differences"] == [
        {
            "path": "trainer.lr",
            "values": {str(b.pk): 3e-6, str(a.pk): 1e-6, str(c.pk): 1e-6},
            "absent": [],
            "cut": [],
        }
    ]
    assert (body["total_differences"], body["truncated"]) == (1, False)
    assert compare(client_for(team["member"]), [a.pk, c.pk])["differences"] == []
    assert compare(client_for(team["member"]), [a.pk])["differences"] == []


def test_several_fields_sorted_by_path_and_a_changed_list_is_one_difference(team):
    base = stored_demo_config()
    other = with_lr(base, 5e-6)
    other["seed"] = base["seed"] + 1
    other["trainer"]["total_steps"] = base["trainer"]["total_steps"] + 7
    assert isinstance(base["logging"]["sinks"], list)
    other["logging"]["sinks"] = [*base["logging"]["sinks"], "jsonl"]
    a, b = launched(team, base, "a"), launched(team, other, "b")
    got = compare(client_for(team["viewer"]), [a.pk, b.pk])["differences"]
    assert [d["path"] for d in got] == ["logging.sinks", "seed", "trainer.lr", "trainer.total_steps"]
    assert got[0]["values"] == {str(a.pk): base["logging"]["sinks"], str(b.pk): other["logging"]["sinks"]}


def test_a_default_written_out_equals_one_left_implicit(team):
    """Runs are compared by their validated configs, so a stored row with every default explicit and one
    that leaves them implicit do not differ."""
    implicit = demo_config()
    explicit = stored_demo_config()
    assert "micro_batch_size" not in implicit["trainer"] and explicit["trainer"]["micro_batch_size"] is None
    exp = ExperimentFactory(project=team["project"])
    a = RunFactory(experiment=exp, config=implicit)
    b = RunFactory(experiment=exp, config=explicit)
    c = RunFactory(experiment=exp, config={**implicit, "trainer": {**implicit["trainer"], "lr": 2e-5}})
    body = compare(client_for(team["viewer"]), [a.pk, b.pk, c.pk])
    assert [r["config_basis"] for r in body["runs"]] == ["validated"] * 3
    assert [d["path"] for d in body["differences"]] == ["trainer.lr"]


def test_a_config_that_no_longer_parses_is_compared_as_stored_and_said_so(team):
    """An older schema's field: that run is compared by its stored document; absent is not null."""
    current = stored_demo_config()
    old = copy.deepcopy(current)
    old["trainer"]["legacy_knob"] = None
    exp = ExperimentFactory(project=team["project"])
    a = RunFactory(experiment=exp, config=current)
    b = RunFactory(experiment=exp, config=old)
    body = compare(client_for(team["viewer"]), [a.pk, b.pk])
    assert [r["config_basis"] for r in body["runs"]] == ["validated", "stored"]
    assert body["runs"][0]["config_problem"] is None
    assert "trainer.legacy_knob" in body["runs"][1]["config_problem"]
    assert body["differences"] == [
        {"path": "trainer.legacy_knob", "values": {str(b.pk): None}, "absent": [a.pk], "cut": []}
    ]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({}, "required"),
        ({"ids": ""}, "required"),
        ({"ids": " , "}, "required"),
        ({"ids": "1,x"}, "'x' is not a run id"),
        ({"ids": "1,,2"}, "'' is not a run id"),
        ({"ids": "1.5"}, "'1.5' is not a run id"),
        ({"ids": "-3"}, "'-3' is not a run id"),
        ({"ids": "0"}, "'0' is not a run id"),
        ({"ids": "\u0661"}, "is not a run id"),  # a digit, but not an ASCII one
        ({"ids": "9" * 5000}, "is not a run id"),  # beyond int()'s digit limit: never a 500
        ({"ids": str(2**63)}, "is not a run id"),  # beyond a database id
        ({"ids": ",".join(map(str, range(1, 22)))}, "at most 20 runs can be compared, got 21"),
        ({"ids": "4,5,4,6,5"}, "each run may be listed once; repeated: 4, 5"),
    ],
)
def test_bad_ids_are_a_400_at_ids(team, query, message):
    resp = client_for(team["viewer"]).get("/api/runs/compare", query)
    assert resp.status_code == 400, resp.content[:300]
    errors = resp.json()["errors"]
    assert list(errors) == ["ids"] and message in errors["ids"][0], errors


def test_twenty_runs_may_be_compared(team):
    exp = ExperimentFactory(project=team["project"])
    runs = [RunFactory(experiment=exp) for _ in range(20)]
    body = compare(client_for(team["viewer"]), [r.pk for r in runs])
    assert len(body["runs"]) == 20 and body["differences"] == []


def test_runs_of_other_projects_and_missing_runs_are_a_404(team):
    mine = launched(team, stored_demo_config(), "mine")
    theirs = RunFactory(experiment=ExperimentFactory(project=team["other_project"]))
    viewer = client_for(team["viewer"])
    for ids in ([theirs.pk], [mine.pk, theirs.pk], [mine.pk, theirs.pk + 1000]):
        resp = viewer.get("/api/runs/compare", {"ids": ",".join(map(str, ids))})
        assert resp.status_code == 404, (ids, resp.content[:300])
        assert "differences" not in resp.json()
    assert client_for(team["stranger"]).get("/api/runs/compare", {"ids": mine.pk}).status_code == 404
    assert client_for().get("/api/runs/compare", {"ids": mine.pk}).status_code == 401


def test_the_openapi_document_describes_the_operation(db):
    schema = SchemaGenerator().get_schema(request=None, public=True)
    op = schema["paths"]["/api/runs/compare"]["get"]
    (ids,) = [p for p in op["parameters"] if p["name"] == "ids"]
    assert ids["in"] == "query" and ids["required"] is True
    assert {"200", "400", "404"} <= set(op["responses"])
    ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert set(schema["components"]["schemas"][ref]["properties"]) == {
        "runs",
        "differences",
        "total_differences",
        "truncated",
    }


def with_overrides(config: dict, overrides: dict) -> dict:
    out = copy.deepcopy(config)
    out["model"]["override_config"] = overrides
    return out


def test_the_answer_is_bounded_whatever_the_free_form_overrides_hold(team):
    """``model.override_config`` is free-form: thousands of differing keys, or one huge value, still give
    a bounded answer (the first fields by path, values cut), which says what it left out."""
    from experiments.selectors import COMPARE_MAX_DIFFERENCES, COMPARE_MAX_VALUE_CHARS

    base = stored_demo_config()
    keys = [f"k{i:04d}" for i in range(1000)]
    runs = [launched(team, with_overrides(base, {k: n for k in keys}), f"r{n}") for n in range(3)]
    body = compare(client_for(team["viewer"]), [r.pk for r in runs])
    # the reference: every key differs (its value is the run's number); the first by path are shown
    expected = sorted(f"model.override_config.{k}" for k in keys)[:COMPARE_MAX_DIFFERENCES]
    assert [d["path"] for d in body["differences"]] == expected
    assert body["total_differences"] == 1000 and body["truncated"] is True
    assert body["differences"][0]["values"] == {str(r.pk): n for n, r in enumerate(runs)}

    huge = "x" * 50_000
    a = launched(team, with_overrides(base, {"blob": huge}), "huge")
    b = launched(team, with_overrides(base, {"blob": "small"}), "small")
    [diff] = compare(client_for(team["viewer"]), [a.pk, b.pk])["differences"]
    assert diff["cut"] == [a.pk]
    shown = diff["values"][str(a.pk)]
    assert (
        len(shown) == COMPARE_MAX_VALUE_CHARS and shown == ('"' + huge)[: COMPARE_MAX_VALUE_CHARS - 1] + "…"
    )
    assert diff["values"][str(b.pk)] == "small"


def test_twenty_runs_of_long_values_stay_under_the_answers_text_budget(team):
    from experiments.selectors import COMPARE_MAX_TEXT_CHARS, COMPARE_MAX_VALUE_CHARS

    base = stored_demo_config()
    runs = [
        launched(team, with_overrides(base, {f"k{i:03d}": f"{n}-" + "v" * 900 for i in range(100)}), f"r{n}")
        for n in range(20)
    ]
    resp = client_for(team["viewer"]).get("/api/runs/compare", {"ids": ",".join(str(r.pk) for r in runs)})
    body = resp.json()
    text = sum(len(json.dumps(v)) for d in body["differences"] for v in d["values"].values())
    assert text <= COMPARE_MAX_TEXT_CHARS and body["truncated"] and body["total_differences"] == 100
    assert 0 < len(body["differences"]) < 100
    per_field = 20 * min(len(json.dumps("19-" + "v" * 900)), COMPARE_MAX_VALUE_CHARS)
    assert len(body["differences"]) == COMPARE_MAX_TEXT_CHARS // per_field
    assert len(resp.content) < 2 * COMPARE_MAX_TEXT_CHARS

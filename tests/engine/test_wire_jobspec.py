"""The engine's half of the seam: what the HTTP sink builds is what the wire models accept, the launch
spec's environment reads back as the spec it was written from, and the spec keeps the user's config
(what to train) apart from its placement (where it runs)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from rl_engine import jobspec, wire
from rl_engine.config import ConfigError, parse_config
from rl_engine.jobspec import IngestSpec, InputPaths, JobSpec, Placement
from rl_engine.sinks.http_replies import rejection_alert


def test_the_sinks_bodies_are_what_the_wire_models_accept():
    points = wire.MetricsBody.model_validate({"points": [wire.point("reward/mean", 3, 0.5, 1.7e9)]})
    assert points.points == [{"key": "reward/mean", "step": 3, "value": 0.5, "wall_time": 1.7e9}]
    events = [
        wire.event("checkpoint", "saved", {"step": 3, "path": "/c"}),
        rejection_alert("samples", 400, {}),
    ]
    body = wire.EventsBody.model_validate({"events": events, "batch_id": "a1.0"})
    assert [e.kind for e in body.events] == [wire.EventKind.CHECKPOINT, wire.EventKind.ALERT]
    assert wire.event_data_errors(body.events) == {}
    # An engine sample names the weights' versions its own way; on the wire they are version_start/_end.
    engine_sample = {
        "prompt": "ab",
        "response": "ab",
        "reward": 1.0,
        "param_version_start": 2,
        "param_version_end": 3,
    }
    sent = wire.sample(engine_sample, 7)
    assert sent == {
        "prompt": "ab",
        "response": "ab",
        "reward": 1.0,
        "version_start": 2,
        "version_end": 3,
        "step": 7,
    }
    (sample,) = wire.SamplesBody.model_validate({"samples": [sent]}).samples
    assert (sample.step, sample.version_start, sample.version_end) == (7, 2, 3)


def test_the_builders_shape_but_leave_refusing_to_the_platform():
    # An engine must not die of a malformed log line: the sink sends it, the platform refuses it (400) and
    # the sink keeps it in its rejected log.
    bogus = wire.event("bogus", "x")
    with pytest.raises(wire.WireError) as err:
        wire.parse(wire.EventsBody, {"events": [bogus]})
    assert list(err.value.errors) == ["events[0].kind"]
    assert wire.ITEMS == {"metrics": "points", "events": "events", "samples": "samples"}


def test_the_launch_specs_environment_reads_back_as_the_spec(tmp_path):
    token_file = tmp_path / "ingest-token"
    written = IngestSpec(url="http://platform:8000", run_id="12", token_file=str(token_file),
                         spool_dir=str(tmp_path / "spool"), heartbeat_s=7.5)  # fmt: skip
    env = written.env()
    assert env == {
        jobspec.URL: "http://platform:8000",
        jobspec.RUN_ID: "12",
        jobspec.TOKEN_FILE: str(token_file),
        jobspec.SPOOL_DIR: str(tmp_path / "spool"),
        jobspec.HEARTBEAT_S: "7.5",
    }  # only what was given: a value the job inherits (a benchmark's flush interval) is not overridden
    read = IngestSpec.from_env(env)
    assert (read.url, read.run_id, read.token_file, read.token) == (
        "http://platform:8000",
        "12",
        str(token_file),
        None,
    )
    assert (read.spool_dir, read.heartbeat_s, read.flush_s, read.close_timeout_s) == (
        str(tmp_path / "spool"),
        7.5,
        0.05,
        60.0,
    )
    # The token file wins over a token in the environment; a token itself is written only without a file.
    assert IngestSpec.from_env({**env, jobspec.TOKEN: "rlp_x"}).token is None
    assert IngestSpec(url="u", run_id="1", token="rlp_x").env()[jobspec.TOKEN] == "rlp_x"
    with pytest.raises(ValueError, match="RL_ENGINE_RUN_ID is not set"):
        IngestSpec.from_env({jobspec.URL: "u", jobspec.TOKEN: "t"})
    with pytest.raises(ValidationError):
        IngestSpec(url="u", run_id="1", heartbeat_s=0)


def test_the_job_spec_keeps_what_to_train_apart_from_where_it_runs(tmp_path):
    """The spec's file holds the user's config untouched and the placement beside it; the sinks are the
    config's and then the placement's (each once); the ingest half travels in the environment only."""
    config = parse_config(
        {"model": {"path": "m"}, "trainer": {"total_steps": 3}, "logging": {"sinks": ["jsonl", "http"]}}
    )
    placement = Placement(run_dir="/runs/r1", checkpoint_dir="/runs/r1/checkpoints",
                          resume_from="/runs/r0/checkpoints/step_2", sinks=("http",), progress_bar=False)  # fmt: skip
    spec = JobSpec(
        config=config, placement=placement, ingest=IngestSpec(url="u", run_id="1", token_file="/t")
    )
    document = spec.spec_document()
    assert set(document) == {"config", "placement"} and document["config"] == config.model_dump(mode="json")
    assert "checkpoint_dir" not in document["config"]["trainer"]
    read = JobSpec.from_document(yaml.safe_load(yaml.safe_dump(document)))
    assert read.config == config and read.placement == placement and read.ingest is None
    assert placement.all_sinks(config.logging.sinks) == ["jsonl", "http"]
    assert placement.jsonl_file() == "/runs/r1/metrics.jsonl"
    assert spec.run_id == "1" and spec.env() == spec.ingest.env()


def test_a_run_folder_places_the_local_logs_and_stores_but_not_a_server():
    placed = Placement(run_dir="/runs/r1")
    assert placed.wandb_folder() == "/runs/r1/wandb"
    assert placed.mlflow_store(None) == ("sqlite:////runs/r1/mlflow.db", "/runs/r1/mlflow-artifacts")
    assert placed.mlflow_store("sqlite:///team.db") == (
        "sqlite:////runs/r1/team.db",
        "/runs/r1/mlflow-artifacts",
    )
    assert placed.mlflow_store("http://mlflow:5000") == ("http://mlflow:5000", None)
    standalone = Placement(jsonl_path="/tmp/x.jsonl")
    assert standalone.mlflow_store(None) == (None, None) and standalone.wandb_folder() is None
    assert standalone.jsonl_file() == "/tmp/x.jsonl"


def test_a_jsonl_sink_without_a_place_for_its_file_is_refused_at_the_sinks_field():
    config = parse_config({"model": {"path": "m"}, "logging": {"sinks": ["jsonl"]}})
    with pytest.raises(ConfigError) as exc:
        JobSpec.from_document({"config": config, "placement": {}})
    assert [path for path, _ in exc.value.errors] == ["config.logging.sinks"]
    assert (
        JobSpec(config=config, placement=Placement(run_dir="/r")).placement.jsonl_file() == "/r/metrics.jsonl"
    )


def test_the_placements_input_paths_are_what_the_engine_reads():
    config = parse_config({"model": {"path": "rel/model"}, "data": {"source": "jsonl", "path": "d.jsonl"}})
    inputs = InputPaths(model_path="/work/rel/model", data_path="/data/d.jsonl", data_cache_dir="/c")
    run = JobSpec(config=config, placement=Placement(inputs=inputs)).run_config()
    assert (run.model.path, run.data.path) == ("/work/rel/model", "/data/d.jsonl")
    assert not hasattr(run.data, "cache_dir")  # a field the data source does not have is not invented
    assert (config.model.path, config.data.path) == ("rel/model", "d.jsonl")  # the user's, untouched
    assert JobSpec(config=config).run_config() is config

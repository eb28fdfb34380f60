"""MLflow and W&B mirrors, run for real in their offline forms and read back with their own formats:
MLflow's SQLite store through ``MlflowClient``, W&B ``mode=offline`` run files. A failing, slow or
missing mirror never raises into training: it becomes an alert event on the other sinks."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rl_engine.config import LoggingConfig, MlflowConfig, WandbConfig
from rl_engine.jobspec import Placement
from rl_engine.sinks import MirrorSink, MultiSink, build_sinks
from rl_engine.sinks.base import MetricsSink
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
SAMPLES = [{"prompt": "what is 2 + 3?", "response": "#### 5", "answer": "#### 5", "reward": 1.0}]


def _drive(sink: MetricsSink, ckpt: Path) -> None:
    """What the driver sends during a 3-step run, with an evaluation that reports after step 3."""
    sink.log_event("status", "pipeline running (fully_async) from step 0", {"step": 0})
    for step in (1, 2, 3):
        sink.log_metrics(step, {"reward/mean": step / 10, "actor/pg_loss": -step / 100})
    sink.log_samples(3, SAMPLES)
    sink.log_metrics(2, {"val/reward_mean": 0.25, "val/pass@4": 0.5})  # out of order, like an async eval
    sink.log_event("checkpoint", "checkpoint at step 3", {"step": 3, "path": str(ckpt), "size_bytes": 10})
    sink.log_event("status", "finished at step 3", {"step": 3, "stopped": False})
    sink.close()


def _jsonl_events(path: Path, kind: str) -> list[dict]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in records if r["type"] == "event" and r["kind"] == kind]


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    model = tmp_path / "ckpts" / "step_00000003" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    return model.parent


def test_mlflow_mirror_writes_a_run_that_mlflow_reads_back(tmp_path, make_cfg, checkpoint):
    """A local store named by the config (``sqlite:///NAME.db``) goes, with its artifacts and the JSONL
    log, into the placement's run folder: what a platform job gets."""
    from mlflow.tracking import MlflowClient

    cfg = make_cfg("name=copy-demo")
    logging_cfg = LoggingConfig(
        sinks=["jsonl", "mlflow"],
        mlflow=MlflowConfig(tracking_uri="sqlite:///store.db", experiment="rl-tests", log_checkpoints=True),
    )
    _drive(build_sinks(logging_cfg, placement=Placement(run_dir=str(tmp_path)), experiment=cfg), checkpoint)

    uri = f"sqlite:///{tmp_path / 'store.db'}"

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("rl-tests")
    [run] = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "copy-demo"
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "reward/mean")}
    assert history == {1: 0.1, 2: 0.2, 3: 0.3}
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val/pass_at_4")] == [
        (2, 0.5)
    ]
    assert run.data.params["trainer.lr"] == str(cfg.trainer.lr) and run.data.params["data.task"] == "copy"
    assert run.data.tags["rl_engine.last_checkpoint"] == str(checkpoint)
    assert run.data.tags["rl_engine.status"] == "finished at step 3"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "samples")}
    assert artifacts == {"samples/step_00000003.json"}
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "samples/step_00000003.json", str(tmp_path)))
                       .read_text())  # fmt: skip
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    assert rows == [{"step": 3, **SAMPLES[0]}]
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints/step_00000003")] == [
        "checkpoints/step_00000003/config.json"]  # fmt: skip
    assert client.get_experiment(exp.experiment_id).artifact_location == str(tmp_path / "mlflow-artifacts")
    assert _jsonl_events(tmp_path / "metrics.jsonl", "alert") == []


def test_mlflow_mirror_logs_a_lora_checkpoints_adapters_beside_its_model_folder(
    tmp_path, make_cfg, checkpoint
):
    from mlflow.tracking import MlflowClient

    adapter = checkpoint / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    logging_cfg = LoggingConfig(
        sinks=["mlflow"],
        mlflow=MlflowConfig(tracking_uri="sqlite:///store.db", experiment="e", log_checkpoints=True),
    )
    _drive(
        build_sinks(logging_cfg, placement=Placement(run_dir=str(tmp_path)), experiment=make_cfg()),
        checkpoint,
    )
    client = MlflowClient(f"sqlite:///{tmp_path / 'store.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints/step_00000003/adapter")] == [
        "checkpoints/step_00000003/adapter/adapter_config.json"]  # fmt: skip


def _wandb_records(run_file: Path) -> list:
    """Records of a W&B transaction log (``run-*.wandb``): LevelDB's log format (32 KiB blocks of
    [crc32 u32][length u16][type u8] chunks, FULL=1 FIRST=2 MIDDLE=3 LAST=4) after a 7-byte header
    ``:W&B`` + magic + version, each record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):
            break  # a chunk still being written
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind in (2, 3):
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
            pending = b""
    return [pb.Record.FromString(c) for c in out]


def test_wandb_offline_mirror_writes_a_run_that_reads_back(tmp_path, make_cfg, checkpoint):
    cfg = make_cfg("name=copy-demo")
    logging_cfg = LoggingConfig(sinks=["wandb"], wandb=WandbConfig(mode="offline", project="p"))
    _drive(build_sinks(logging_cfg, placement=Placement(wandb_dir=str(tmp_path)), experiment=cfg), checkpoint)

    [run_dir] = (tmp_path / "wandb").glob("offline-run-*")
    run_file = next(run_dir.glob("run-*.wandb"))

    def complete() -> list:  # W&B's service may still be writing the log when finish() returns
        records = _wandb_records(run_file)
        return records if any(r.WhichOneof("record_type") == "exit" for r in records) else []

    records = wait_for(complete, timeout_s=30, interval_s=0.2, message="the W&B log's exit record")
    rows = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
    by_step: dict[int, dict] = {}
    for row in rows:
        by_step.setdefault(row["trainer/step"], {}).update(row)
    assert sorted(by_step) == [1, 2, 3], rows
    assert by_step[1]["reward/mean"] == 0.1 and by_step[3]["actor/pg_loss"] == -0.03
    assert by_step[2]["val/pass@4"] == 0.5  # logged after step 3, still at step 2 on the trainer/step axis
    assert by_step[3]["samples/_type"] == "table-file"
    config = {}
    for r in records:  # the run record carries the initial config; config records later changes
        kind = r.WhichOneof("record_type")
        if kind in ("run", "config"):
            items = r.run.config.update if kind == "run" else r.config.update
            config.update({i.key: json.loads(i.value_json) for i in items})
    assert config["trainer"]["lr"] == cfg.trainer.lr and config["data"]["task"] == "copy"
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update(
                {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.summary.update}
            )
    assert summary["rl_engine/last_checkpoint"] == str(checkpoint)
    assert any(r.WhichOneof("record_type") == "exit" and r.exit.exit_code == 0 for r in records)
    [table_file] = (run_dir / "files" / "media" / "table").glob("samples_*.table.json")
    table = json.loads(table_file.read_text())
    assert [dict(zip(table["columns"], row, strict=True)) for row in table["data"]] == [
        {"step": 3, **SAMPLES[0]}
    ]


def test_an_unreachable_mlflow_server_becomes_one_alert_and_training_goes_on(tmp_path, make_cfg, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logging_cfg = LoggingConfig(
        sinks=["jsonl", "mlflow"], mlflow=MlflowConfig(tracking_uri=f"http://127.0.0.1:{port}")
    )
    sink = build_sinks(
        logging_cfg, placement=Placement(jsonl_path=str(tmp_path / "run.jsonl")), experiment=make_cfg()
    )
    for step in range(1, 50):
        sink.log_metrics(step, {"reward/mean": 0.5})  # never raises
    sink.close()
    alerts = _jsonl_events(tmp_path / "run.jsonl", "alert")
    assert len(alerts) == 1, alerts
    assert alerts[0]["message"].startswith("mlflow mirror: start failed (1x): ")
    assert (
        alerts[0]["message"].endswith("training continues without it")
        and alerts[0]["data"]["sink"] == "mlflow"
    )
    metrics = [json.loads(x) for x in (tmp_path / "run.jsonl").read_text().splitlines() if '"metrics"' in x]
    assert len(metrics) == 49  # the other sinks got everything


class _Failing(MetricsSink):
    def __init__(self, release: threading.Event | None = None):
        self.release, self.calls = release, 0

    def log_metrics(self, step, metrics):
        self.calls += 1
        if self.release is not None:
            self.release.wait(30)
            return
        raise ConnectionError("tracker went away")


def test_mirror_failures_mid_run_are_rate_limited_alerts(tmp_path):
    events: list[tuple] = []
    inner = _Failing()
    mirror = MirrorSink("wandb", lambda: inner, lambda *e: events.append(e), alert_every=10)
    sink = MultiSink([mirror])
    for step in range(25):
        sink.log_metrics(step, {"x": 1.0})
    sink.close()
    assert inner.calls == 25 and mirror.failures["log_metrics"] == 25
    assert [e[1] for e in events] == [
        f"wandb mirror: log_metrics failed ({n}x): ConnectionError: tracker went away; training continues without it"
        for n in (1, 10, 20)
    ]


def test_a_hung_mirror_does_not_block_the_caller(tmp_path):
    release = threading.Event()
    inner = _Failing(release)
    mirror = MirrorSink("mlflow", lambda: inner, lambda *e: None, max_queue=3, close_timeout_s=30)
    for step in range(10):  # the first call hangs in the tracker; these return anyway
        mirror.log_metrics(step, {"x": 1.0})
    assert mirror.dropped >= 6 and mirror.pending() <= 3
    release.set()
    mirror.close()
    assert inner.calls == 10 - mirror.dropped


def test_the_engine_imports_and_logs_without_the_trackers_installed(tmp_path):
    script = (
        "import sys; sys.modules['mlflow'] = None; sys.modules['wandb'] = None\n"  # as if not installed
        "import rl_engine.sinks, rl_engine.cli\n"
        "from rl_engine.config import LoggingConfig\n"
        "from rl_engine.jobspec import Placement\n"
        f"s = rl_engine.sinks.build_sinks(LoggingConfig(sinks=['jsonl', 'wandb']), placement=Placement(jsonl_path={str(tmp_path / 'r.jsonl')!r}))\n"
        "s.log_metrics(1, {'reward/mean': 1.0}); s.close()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    [alert] = _jsonl_events(tmp_path / "r.jsonl", "alert")
    assert alert["message"].startswith(
        "wandb mirror: start failed (1x): ModuleNotFoundError: import of wandb halted"
    )

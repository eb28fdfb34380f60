"""Sinks and the command line: one-line errors, exit codes, outputs that other tools parse."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rl_engine.cli import _placement_flags, build_parser, load_job, main
from rl_engine.config import LoggingConfig, experiment_json_schema, parse_config
from rl_engine.jobspec import JobSpec, Placement
from rl_engine.presets import get_preset
from rl_engine.sinks import JsonlSink, MetricsSink, MultiSink, StdoutSink, build_sinks

REPO = Path(__file__).resolve().parents[2]


def test_stdout_sink_prints_one_compact_line_per_logged_step():
    buf = io.StringIO()
    sink = StdoutSink(every=2, stream=buf)
    sink.log_metrics(1, {"reward/mean": 0.5})
    sink.log_metrics(2, {"reward/mean": 0.25, "actor/entropy": 1.23456, "unlisted/key": 9.0})
    sink.log_metrics(4, {"val/reward_mean": 0.5})  # nothing of the line's: no empty line
    sink.log_event("status", "running")
    lines = buf.getvalue().splitlines()
    assert lines == ["step 2 | reward 0.25 | entropy 1.235", "[status] running"]


def test_jsonl_sink_writes_parseable_records(tmp_path: Path):
    path = tmp_path / "m" / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log_metrics(3, {"reward/mean": 0.75})
    sink.log_event("alert", "slow", {"stage": "rollout"})
    sink.log_samples(3, [{"prompt": "copy a:", "response": "a", "reward": 1.0}])
    sink.close()
    sink.log_metrics(4, {"reward/mean": 1.0})  # after close: ignored, no crash
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["type"] for r in records] == ["metrics", "event", "samples"]
    assert records[0]["step"] == 3 and records[0]["metrics"] == {"reward/mean": 0.75}
    assert records[1]["data"] == {"stage": "rollout"}


def test_multi_sink_delivers_to_all_even_when_one_fails():
    class Boom(MetricsSink):
        def log_metrics(self, step, metrics):
            raise RuntimeError("down")

    got = []

    class Keep(MetricsSink):
        def log_metrics(self, step, metrics):
            got.append(step)

    with pytest.raises(RuntimeError, match="down"):
        MultiSink([Boom(), Keep()]).log_metrics(7, {})
    assert got == [7]


def test_build_sinks_from_logging_config_and_placement(tmp_path: Path):
    placement = Placement(jsonl_path=str(tmp_path / "x.jsonl"))
    sink = build_sinks(LoggingConfig(sinks=["stdout", "jsonl"]), placement=placement, total_steps=5)
    assert isinstance(sink, MultiSink)
    assert [type(s).__name__ for s in sink.sinks] == ["StdoutSink", "JsonlSink", "ProgressSink"]
    sink.log_metrics(1, {"reward/mean": 0.5})
    sink.close()
    assert (tmp_path / "x.jsonl").exists()
    quiet = Placement(progress_bar=False, sinks=("jsonl",), run_dir=str(tmp_path / "run"))
    both = build_sinks(LoggingConfig(sinks=["stdout"]), placement=quiet, total_steps=5)
    assert [type(s).__name__ for s in both.sinks] == ["StdoutSink", "JsonlSink"]  # the placement's sink added
    both.close()
    assert (tmp_path / "run" / "metrics.jsonl").exists()


def _spec_file(tmp_path: Path, placement: dict) -> Path:
    config = parse_config({**get_preset("demo-cpu"), "logging": {"sinks": ["jsonl"]}})
    path = tmp_path / "job.yaml"
    document = JobSpec(config=config, placement=Placement(**placement)).spec_document()
    path.write_text(yaml.safe_dump(document))
    return path


def test_train_and_validate_take_a_job_spec_file_which_carries_its_own_placement(capsys, tmp_path: Path):
    spec = _spec_file(tmp_path, {"run_dir": str(tmp_path / "run"), "checkpoint_dir": str(tmp_path / "ck")})
    assert main(["validate", "--config", str(spec)]) == 0
    assert capsys.readouterr().out == "ok\n"
    assert main(["validate", "--config", str(spec), "--set", "trainer.lr=-1"]) == 1  # --set edits its config
    assert capsys.readouterr().out == "config.trainer.lr: Input should be greater than 0\n"
    assert main(["validate", "--config", str(spec), "--checkpoint-dir", "/elsewhere"]) == 2
    assert "carries its own placement; drop --checkpoint-dir" in capsys.readouterr().err
    bad = _spec_file(tmp_path, {"run_dir": str(tmp_path / "run")})
    bad.write_text(bad.read_text().replace("run_dir:", "ray_address: ray://a@b:1\n  run_dir:"))
    assert main(["validate", "--config", str(bad)]) == 1
    assert capsys.readouterr().out.startswith("placement.ray_address: the address must not contain user-info")


def test_a_plain_config_gets_its_placement_from_flags(capsys, tmp_path: Path):
    base = ["validate", "--config", "preset:demo-cpu", "--set", "logging.sinks=[jsonl]"]
    assert main(base) == 1
    assert capsys.readouterr().out.startswith(
        "logging.sinks: includes 'jsonl' but the placement has no JSONL"
    )
    assert main([*base, "--jsonl-path", str(tmp_path / "m.jsonl")]) == 0
    assert main([*base, "--run-dir", str(tmp_path)]) == 0
    assert main(["validate", "--config", "preset:demo-cpu", "--ray-address", "ray://a@b:1"]) == 1
    assert capsys.readouterr().out.startswith("ok\nok\n--ray-address: the address must not contain user-info")
    flags = [
        "--checkpoint-dir",
        "/c",
        "--resume-from",
        "/c/step_2",
        "--ray-address",
        "auto",
        "--no-progress-bar",
    ]
    spec = load_job(
        "preset:demo-cpu", [], _placement_flags(build_parser().parse_args(["train", "--config", "x", *flags]))
    )
    assert spec.placement == Placement(
        checkpoint_dir="/c", resume_from="/c/step_2", ray_address="auto", progress_bar=False
    )


def test_a_legacy_config_has_its_moved_fields_lifted_with_one_notice_each(capsys, tmp_path: Path):
    """A standalone user's YAML from before the split still runs: each moved field goes into the
    placement, with a one-line notice naming the flag; one also given as a flag is a usage error."""
    legacy = tmp_path / "old.yaml"
    data = get_preset("demo-cpu")
    data["trainer"] |= {"checkpoint_dir": str(tmp_path / "ck"), "resume_from": None}  # null: the old default
    data["logging"] |= {"sinks": ["jsonl"], "jsonl_path": str(tmp_path / "m.jsonl"), "progress_bar": False}
    legacy.write_text(yaml.safe_dump(data))
    spec = load_job(str(legacy), [], {})
    assert spec.placement == Placement(checkpoint_dir=str(tmp_path / "ck"), jsonl_path=str(tmp_path / "m.jsonl"),
                                       progress_bar=False)  # fmt: skip
    notes = capsys.readouterr().err.splitlines()
    assert [n.split(" moved out")[0] for n in notes] == [
        "note: trainer.checkpoint_dir", "note: logging.jsonl_path", "note: logging.progress_bar"]  # fmt: skip
    assert "pass --checkpoint-dir instead" in notes[0] and "pass --no-progress-bar instead" in notes[2]
    assert main(["validate", "--config", str(legacy), "--checkpoint-dir", "/c"]) == 2
    assert "trainer.checkpoint_dir (in the config) and --checkpoint-dir both set" in capsys.readouterr().err
    assert load_job("preset:demo-cpu", ["pipeline.ray_address=auto"], {}).placement.ray_address == "auto"


@pytest.mark.smoke
def test_validate_prints_ok_or_one_line_with_the_field_path(capsys, tmp_path: Path):
    assert main(["validate", "--config", "preset:demo-cpu"]) == 0
    assert capsys.readouterr().out == "ok\n"
    assert main(["validate", "--config", "preset:demo-cpu", "--set", "trainer.lr=-1"]) == 1
    assert capsys.readouterr().out == "trainer.lr: Input should be greater than 0\n"
    assert main(["validate", "--config", "preset:demo-cpu", "--set", "reward.name=evil"]) == 1
    assert capsys.readouterr().out.startswith("reward.name: unknown reward 'evil'")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model:\n  path: m\nrollout:\n  backend: hf\n  n: 0\n")
    assert main(["validate", "--config", str(cfg)]) == 1
    assert capsys.readouterr().out == "rollout.n: Input should be greater than or equal to 1\n"
    # Every preset validates, including the GPU one whose data is not on this machine.
    for name in ["demo-cpu", "gsm8k-qwen2.5-1.5b-vllm"]:
        assert main(["validate", "--config", f"preset:{name}"]) == 0


def test_cli_errors_are_one_line_without_traceback(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    cases = [
        (["validate", "--config", str(bad)], 1, "is not valid YAML (line"),
        (["validate", "--config", str(tmp_path / "missing.yaml")], 1, "cannot read"),
        (["validate", "--config", "preset:nope"], 1, "unknown preset 'nope'"),
        (
            ["train", "--config", "preset:demo-cpu", "--set", "rollout.n=7"],
            1,
            "must be a multiple of rollout.n",
        ),
        (["validate"], 2, "the following arguments are required: --config"),
    ]
    for argv, code, text in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "rl_engine", *argv], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        out = (proc.stdout + proc.stderr).strip()
        assert proc.returncode == code, (argv, out)
        assert text in out, (argv, out)
        assert "Traceback" not in out
        if code == 1:
            assert len(out.splitlines()) == 1, out


def test_presets_and_schema_commands(capsys):
    assert main(["presets"]) == 0
    names = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    assert "demo-cpu" in names
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == experiment_json_schema()


def test_progress_bar_shows_reward_on_a_terminal_only():
    from rl_engine.sinks import ProgressSink

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    bar = ProgressSink(10, stream=tty)
    bar.log_metrics(4, {"reward/mean": 0.625})
    bar.log_metrics(6, {"reward/mean": 0.75})
    assert bar.bar.n == 6
    bar.close()
    assert "reward=0.750" in tty.getvalue() and "6/10" in tty.getvalue()
    piped = io.StringIO()
    quiet = ProgressSink(10, stream=piped)
    quiet.log_metrics(4, {"reward/mean": 0.5})
    quiet.close()
    assert piped.getvalue() == ""

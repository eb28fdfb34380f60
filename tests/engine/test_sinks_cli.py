"""Sinks and the command line: one-line errors, exit codes, outputs that other tools parse."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rl_engine.cli import main
from rl_engine.config import LoggingConfig, experiment_json_schema
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


def test_build_sinks_from_logging_config(tmp_path: Path):
    sink = build_sinks(
        LoggingConfig(sinks=["stdout", "jsonl"], jsonl_path=str(tmp_path / "x.jsonl")), total_steps=5
    )
    assert isinstance(sink, MultiSink)
    assert [type(s).__name__ for s in sink.sinks] == ["StdoutSink", "JsonlSink", "ProgressSink"]
    sink.log_metrics(1, {"reward/mean": 0.5})
    sink.close()
    assert isinstance(build_sinks(LoggingConfig(sinks=["stdout"], progress_bar=False)), StdoutSink)


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

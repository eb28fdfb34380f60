"""The engine checks a platform job's local data again right before reading it (``RL_ENGINE_DATA_ROOTS``,
set by the platform's launcher): a file, a glob's matches or a folder's entries whose real path leaves the
roots is a one-line DataError, whatever was true when the config was accepted. The CLI sets no roots and
reads what its user names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rl_engine import paths
from rl_engine.config import DatasetDataConfig, parse_config
from rl_engine.data import DataError
from rl_engine.data.hf_datasets import load_split
from rl_engine.data.rows import load_jsonl
from rl_engine.jobspec import IngestSpec, JobSpec, Placement


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    root, outside = tmp_path / "data", tmp_path / "outside"
    (root / "set").mkdir(parents=True)
    outside.mkdir()
    (root / "set" / "a.csv").write_text("question,answer\nmine,1\n")
    (outside / "b.csv").write_text("question,answer\nthe other project's,2\n")
    (outside / "b.jsonl").write_text('{"prompt": "the other project\'s", "answer": "2"}\n')
    return {"root": root, "outside": outside, "set": root / "set"}


def _cfg(path: Path | str) -> DatasetDataConfig:
    return DatasetDataConfig.model_validate({"path": str(path), "columns": {"prompt": "question"}})


def _questions(ds) -> list[str]:
    return sorted(ds["question"])


@pytest.mark.parametrize("how", ["glob", "folder"])
def test_a_link_planted_after_the_check_is_refused_before_reading(tree, monkeypatch, how):
    path = f"{tree['set']}/*.csv" if how == "glob" else str(tree["set"])
    monkeypatch.setenv(paths.ROOTS_ENV, str(tree["root"]))
    assert _questions(load_split(_cfg(path), path, "train")) == ["mine"]  # inside: read as before
    os.symlink(tree["outside"] / "b.csv", tree["set"] / "z.csv")
    with pytest.raises(DataError, match=r"z\.csv, whose real path .* leaves the data roots") as err:
        load_split(_cfg(path), path, "train")
    assert "\n" not in str(err.value)
    # the engine's CLI (no roots in its environment) trusts its user
    monkeypatch.delenv(paths.ROOTS_ENV)
    assert _questions(load_split(_cfg(path), path, "train")) == ["mine", "the other project's"]


def test_a_jsonl_file_that_is_a_link_out_is_refused(tree, monkeypatch):
    link = tree["set"] / "train.jsonl"
    os.symlink(tree["outside"] / "b.jsonl", link)
    monkeypatch.setenv(paths.ROOTS_ENV, os.pathsep.join([str(tree["root"]), "/nonexistent-root"]))
    with pytest.raises(DataError, match="leaves the data roots"):
        load_jsonl(link)
    monkeypatch.setenv(paths.ROOTS_ENV, os.pathsep.join([str(tree["root"]), str(tree["outside"])]))
    assert load_jsonl(link) == [("the other project's", "2")]  # a second root holds it: fine


def test_the_platforms_job_spec_hands_the_roots_to_the_engine():
    ingest = IngestSpec(url="http://platform", run_id="1", token_file="/run/token")
    config = parse_config({"model": {"path": "m"}})
    spec = JobSpec(config=config, placement=Placement(data_roots=("/data", "/shared")), ingest=ingest)
    assert paths.roots_from_env(spec.env()) == ["/data", "/shared"]
    assert paths.ROOTS_ENV not in JobSpec(config=config, ingest=ingest).env()

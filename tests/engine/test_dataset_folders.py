"""A local dataset folder is read from the files the engine resolved, never through its card
(``rl_engine/dataset_folder.py``): a card whose ``data_files`` or ``data_dir`` names ``../..``, an absolute
path, a glob reaching out or a URL cannot make a platform job read outside its data roots or make the
cluster fetch anything; the conventional layouts and in-folder cards still load exactly the rows written.
Real folders, real ``datasets``, a real local HTTP server that counts the requests it gets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rl_engine import dataset_folder, paths
from rl_engine.config import DatasetDataConfig
from rl_engine.data import DataError
from rl_engine.data.hf_datasets import load_split
from tests.counting_server import counting_server

MINE = [{"question": f"mine {i}", "answer": str(i)} for i in range(3)]
SECRET = [{"question": "the other project's", "answer": "7"}]


def _csv(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("question,answer\n" + "".join(f"{r['question']},{r['answer']}\n" for r in rows))
    return path


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _parquet(path: Path, rows: list[dict]) -> Path:
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def _card(folder: Path, yaml_text: str, name: str = "README.md") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    body = f"---\n{yaml_text.strip()}\n---\n# a dataset\n" if name == "README.md" else yaml_text
    (folder / name).write_text(body)


def _cfg(path: Path, tmp_path: Path, **extra) -> DatasetDataConfig:
    spec = {"path": str(path), "columns": {"prompt": "question"}, "cache_dir": str(tmp_path / "c"), **extra}
    return DatasetDataConfig.model_validate(spec)


def _rows(ds) -> list[dict]:
    return sorted(({"question": r["question"], "answer": str(r["answer"])} for r in ds), key=str)


def _load(path: Path, tmp_path: Path, split: str = "train", **extra):
    return load_split(_cfg(path, tmp_path, **extra), str(path), split)


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    root, outside = tmp_path / "data", tmp_path / "outside"
    _csv(outside / "x.csv", SECRET)
    _csv(root / "set" / "train.csv", MINE)
    return {"root": root, "outside": outside, "set": root / "set"}


def _hostile(kind: str, tree: dict[str, Path]) -> tuple[str, str]:
    """(file, card text) of a card whose data files lie outside the root, written without a symlink."""
    outside = tree["outside"]
    cards = {
        "dotdot": ("README.md", "configs:\n- config_name: default\n  data_files:\n  - split: train\n"
                                "    path: ../../outside/x.csv"),
        "absolute": ("README.md", f"configs:\n- config_name: default\n  data_files: {outside}/x.csv"),
        "glob": ("README.md", "configs:\n- config_name: default\n  data_files: ../../**/*.csv"),
        "data_dir": ("README.md", "configs:\n- config_name: default\n  data_dir: ../../outside"),
        "standalone yaml": (".huggingface.yaml", "configs:\n- config_name: default\n  data_files:\n"
                                                 "  - ../../outside/x.csv"),
    }  # fmt: skip
    return cards[kind]


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "glob", "data_dir", "standalone yaml"])
def test_a_card_that_reaches_outside_the_roots_is_refused_before_reading(tree, tmp_path, monkeypatch, kind):
    name, text = _hostile(kind, tree)
    _card(tree["set"], text, name)
    monkeypatch.setenv(paths.ROOTS_ENV, str(tree["root"]))
    with pytest.raises(DataError, match=r"leaves the data roots") as err:
        _load(tree["set"], tmp_path)
    assert "\n" not in str(err.value) and f"{tree['set']}/README.md config 'default'" in str(err.value)
    # the engine's CLI (no roots) trusts its user: the card is followed, the files it names read
    monkeypatch.delenv(paths.ROOTS_ENV)
    rows = _rows(_load(tree["set"], tmp_path))
    assert {"question": "the other project's", "answer": "7"} in rows


def test_a_save_to_disk_manifest_that_names_files_outside_is_refused(tree, tmp_path, monkeypatch):
    import datasets

    datasets.Dataset.from_list(SECRET).save_to_disk(str(tree["outside"] / "saved"))
    saved = tree["root"] / "saved"
    datasets.Dataset.from_list(MINE).save_to_disk(str(saved))
    monkeypatch.setenv(paths.ROOTS_ENV, str(tree["root"]))
    assert _rows(_load(saved, tmp_path)) == _rows(MINE)  # as written: fine
    state = json.loads((saved / "state.json").read_text())
    arrow = next(p.name for p in (tree["outside"] / "saved").iterdir() if p.suffix == ".arrow")
    state["_data_files"] = [{"filename": f"../../outside/saved/{arrow}"}]
    (saved / "state.json").write_text(json.dumps(state))
    with pytest.raises(DataError, match=r"its manifest names .* leaves the data roots"):
        _load(saved, tmp_path)


@pytest.mark.parametrize("roots", [True, False])
def test_a_url_in_a_card_is_never_fetched_unless_the_cli_allows_downloads(tree, tmp_path, monkeypatch, roots):
    """A platform job (roots set) never follows a URL in a card, even with data.allow_download; the CLI
    only with it. The internal service gets no request at all."""
    with counting_server() as server:
        _card(tree["set"], f"configs:\n- config_name: default\n  data_files: {server.url}/x.csv")
        if roots:
            monkeypatch.setenv(paths.ROOTS_ENV, str(tree["root"]))
        with pytest.raises(DataError, match=r"a URL in a dataset card is not followed"):
            _load(tree["set"], tmp_path, allow_download=roots)
        assert server.requests == 0, server.paths
        if not roots:  # the CLI that allowed downloads gets what its card names
            rows = _rows(_load(tree["set"], tmp_path, allow_download=True))
            assert rows == [{"question": "from the internal service", "answer": "1"}]
            assert server.requests >= 1


@pytest.mark.parametrize("roots", [True, False])
def test_conventional_layouts_load_the_rows_written(tmp_path, monkeypatch, roots):
    root = tmp_path / "data"
    test_rows = [{"question": "held out", "answer": "9"}]
    hub = root / "hub"  # the hub's parquet export: data/<split>-00000-of-00001.parquet
    _parquet(hub / "data" / "train-00000-of-00002.parquet", MINE[:2])
    _parquet(hub / "data" / "train-00001-of-00002.parquet", MINE[2:])
    _parquet(hub / "data" / "test-00000-of-00001.parquet", test_rows)
    named = root / "named"  # <split>.ext, with files no builder here reads beside them
    _csv(named / "train.csv", MINE)
    _csv(named / "test.csv", test_rows)
    (named / "LICENSE").write_text("MIT\n")
    (named / "README.md").write_text("# no front matter\n")
    folders = root / "folders"  # <split>/*.ext
    _jsonl(folders / "train" / "a.jsonl", MINE[:1])
    _jsonl(folders / "train" / "b.jsonl", MINE[1:])
    _jsonl(folders / "test" / "a.jsonl", test_rows)
    flat = root / "flat"  # one file of no split name: train
    _csv(flat / "problems.csv", MINE)
    if roots:
        monkeypatch.setenv(paths.ROOTS_ENV, str(root))
    for folder in (hub, named, folders, flat):
        assert _rows(_load(folder, tmp_path)) == _rows(MINE), folder
    for folder in (hub, named, folders):
        assert _rows(_load(folder, tmp_path, "test")) == _rows(test_rows), folder
    with pytest.raises(DataError, match=r"no split 'dev'; its splits: train"):
        _load(flat, tmp_path, "dev")


def test_an_in_folder_card_picks_its_config_and_splits(tmp_path, monkeypatch):
    root = tmp_path / "data"
    ds = root / "carded"
    _csv(ds / "easy" / "part1.csv", MINE[:2])
    _csv(ds / "easy" / "part2.csv", MINE[2:])
    _csv(ds / "easy" / "eval.csv", [{"question": "easy eval", "answer": "1"}])
    _csv(ds / "hard" / "train.csv", [{"question": "hard one", "answer": "2"}])
    _csv(ds / "ignored.csv", SECRET)  # named by no config: never read
    _card(
        ds,
        """
configs:
- config_name: easy
  default: true
  data_files:
  - split: train
    path: [easy/part*.csv]
  - split: test
    path: easy/eval.csv
- config_name: hard
  data_dir: hard
""",
    )
    monkeypatch.setenv(paths.ROOTS_ENV, str(root))
    assert _rows(_load(ds, tmp_path)) == _rows(MINE)
    assert _rows(_load(ds, tmp_path, "test")) == [{"question": "easy eval", "answer": "1"}]
    assert _rows(_load(ds, tmp_path, name="hard")) == [{"question": "hard one", "answer": "2"}]
    with pytest.raises(DataError, match=r"no config 'main'; its configs: easy, hard"):
        _load(ds, tmp_path, name="main")


@pytest.mark.parametrize(
    ("card", "message"),
    [
        ("configs:\n- config_name: default\n  sep: ';'\n  data_files: a.csv", r"sep not supported here"),
        ("configs: [", r"its YAML does not parse"),
        ("configs:\n- config_name: default\n  data_files: nothing/*.csv", r"matches no file"),
        ("configs:\n- config_name: a\n  data_files: a.csv\n- config_name: b\n  data_files: a.csv",
         r"several configs \(a, b\): name one with data.name"),
    ],
)  # fmt: skip
def test_a_card_this_engine_cannot_follow_is_a_one_line_error(tmp_path, card, message):
    ds = tmp_path / "ds"
    _csv(ds / "a.csv", MINE)
    _card(ds, card)
    with pytest.raises(DataError, match=message) as err:
        _load(ds, tmp_path)
    assert "\n" not in str(err.value)


def test_a_link_planted_under_a_data_dir_outside_the_folder_is_refused(tmp_path, monkeypatch):
    """``data_dir`` may name a sibling folder inside the roots; what lies under it is walked too."""
    root = tmp_path / "data"
    _csv(root / "shared" / "train.csv", MINE)
    _csv(tmp_path / "outside" / "x.csv", SECRET)
    _card(root / "set", "configs:\n- config_name: default\n  data_dir: ../shared")
    monkeypatch.setenv(paths.ROOTS_ENV, str(root))
    assert _rows(_load(root / "set", tmp_path)) == _rows(MINE)
    os.symlink(tmp_path / "outside" / "x.csv", root / "shared" / "test.csv")
    with pytest.raises(DataError, match=r"data_dir reads .*test\.csv, whose real path"):
        _load(root / "set", tmp_path)


# --- files of the folder itself: links, FIFOs, parser bombs (rl_engine/safe_files.py) -----------------

BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "configs:\n- config_name: default\n  data_files: a.csv\n"
)
DEEP = 100_000


def _saved(folder: Path) -> Path:
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(MINE)}).save_to_disk(str(folder))
    return folder


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["README.md", ".huggingface.yaml"])
def test_a_card_with_yaml_aliases_is_refused_not_expanded(tmp_path, name):
    ds = tmp_path / "ds"
    _csv(ds / "a.csv", MINE)
    _card(ds, BOMB, name)
    with pytest.raises(DataError, match=r"alias \(\*a\)") as err:
        _load(ds, tmp_path)
    assert "\n" not in str(err.value) and f"{ds / name}:" in str(err.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["README.md", ".huggingface.yaml", "dataset_dict.json", "state.json"])
def test_a_card_or_manifest_nested_deep_is_a_one_line_error(tmp_path, monkeypatch, name):
    """Not a RecursionError out of the parser (a 500 at POST /api/experiments)."""
    root = tmp_path / "data"
    if name.endswith(".json"):
        ds = _saved(root / "saved")
        target = ds / name if name == "dataset_dict.json" else ds / "train" / name
        target.write_text("[" * DEEP + "]" * DEEP)
    else:
        ds = root / "ds"
        _csv(ds / "a.csv", MINE)
        _card(ds, "x: " + "[" * DEEP + "]" * DEEP, name)
    monkeypatch.setenv(paths.ROOTS_ENV, str(root))
    with pytest.raises(DataError, match=r"nested deeper than 64 levels") as err:
        _load(ds, tmp_path)
    assert "\n" not in str(err.value)
    with pytest.raises(dataset_folder.FolderError, match=r"nested deeper"):
        if name.endswith(".json"):
            dataset_folder.check_saved(ds, [root])
        else:
            dataset_folder.resolve_files(ds, None, roots=[root], allow_urls=False)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("name", ["README.md", ".huggingface.yaml", "dataset_dict.json", "state.json"])
def test_a_fifo_card_or_manifest_is_refused_without_blocking(tmp_path, name):
    root = tmp_path / "data"
    if name.endswith(".json"):
        ds = _saved(root / "saved")
        target = ds / name if name == "dataset_dict.json" else ds / "train" / name
        target.unlink()
    else:
        ds = root / "ds"
        _csv(ds / "a.csv", MINE)
        target = ds / name
    os.mkfifo(target)
    with pytest.raises(dataset_folder.FolderError, match=r"not a regular file"):
        if name.endswith(".json"):
            dataset_folder.check_saved(ds, [root])
        else:
            dataset_folder.resolve_files(ds, None, roots=[root], allow_urls=False)


@pytest.mark.parametrize("name", ["README.md", ".huggingface.yaml", "dataset_dict.json"])
def test_a_card_or_manifest_linked_from_outside_the_roots_is_not_read(tmp_path, name):
    """The card itself a link out of the roots: not read at all (the walk refuses it too, but the
    resolver must not depend on being called after it)."""
    root, outside = tmp_path / "data", tmp_path / "outside"
    _csv(outside / "x.csv", SECRET)
    if name == "dataset_dict.json":
        ds = _saved(root / "saved")
        (outside / name).write_text(json.dumps({"splits": ["train"]}))
    else:
        ds = root / "ds"
        _csv(ds / "a.csv", MINE)
        body = "configs:\n- config_name: default\n  data_files: a.csv\n"
        (outside / name).write_text(f"---\n{body}---\n" if name == "README.md" else body)
    (ds / name).unlink(missing_ok=True)
    (ds / name).symlink_to(outside / name)
    with pytest.raises(dataset_folder.FolderError, match=r"leaves the data roots"):
        if name == "dataset_dict.json":
            dataset_folder.check_saved(ds, [root])
        else:
            dataset_folder.resolve_files(ds, None, roots=[root], allow_urls=False)
    if name != "dataset_dict.json":  # the CLI (no roots) trusts its user: the link is followed
        layout = dataset_folder.resolve_files(ds, None, roots=[], allow_urls=False)
        assert layout.splits == {"train": [str((ds / "a.csv").resolve())]}


@pytest.mark.parametrize("kind", ["data_files", "data_dir", "manifest"])
def test_a_sibling_folder_whose_name_extends_the_roots_is_outside(tmp_path, monkeypatch, kind):
    """``data_evil`` beside the root ``data``: inside by string prefix, outside by path."""
    root, evil = tmp_path / "data", tmp_path / "data_evil"
    _csv(evil / "train.csv", SECRET)
    assert str(evil).startswith(str(root))
    if kind == "manifest":
        import datasets

        datasets.Dataset.from_list(SECRET).save_to_disk(str(evil / "saved"))
        ds = _saved(root / "saved")
        (ds / "dataset_dict.json").write_text(json.dumps({"splits": ["../../data_evil/saved"]}))
    else:
        ds = root / "set"
        _csv(ds / "a.csv", MINE)
        line = (
            "data_files: ../../data_evil/train.csv" if kind == "data_files" else "data_dir: ../../data_evil"
        )
        _card(ds, f"configs:\n- config_name: default\n  {line}")
    monkeypatch.setenv(paths.ROOTS_ENV, str(root))
    with pytest.raises(DataError, match=r"leaves the data roots"):
        _load(ds, tmp_path)
    with pytest.raises(dataset_folder.FolderError, match=r"leaves the data roots"):
        if kind == "manifest":
            dataset_folder.check_saved(ds, [root])
        else:
            dataset_folder.resolve_files(ds, None, roots=[root], allow_urls=False)

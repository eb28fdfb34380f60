"""The rollout backends' one table (``rl_engine.backends``, defined in its ``registry``): every backend the
config accepts has an entry, the worker and the trainer's side of a broadcast come from it, reading it
loads no engine and no torch, and no engine code outside the config's validators compares a backend's
name."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import types
from typing import get_args

import pytest

from rl_engine.backends import BACKENDS, rollout_backend
from rl_engine.config import RolloutConfig
from rl_engine.weights.broadcast import WEIGHT_GROUP, GroupInit, GroupSender
from tests.conftest import REPO_ROOT
from tests.engine import standins


def test_every_backend_the_config_accepts_has_an_entry():
    union = get_args(RolloutConfig)[0]
    accepted = {get_args(c.model_fields["backend"].annotation)[0] for c in get_args(union)}
    assert set(BACKENDS) == accepted == {"hf", "vllm", "sglang"}
    assert all(entry.name == name for name, entry in BACKENDS.items())
    # the engines' load_weights take whole tensors; the HF worker loads any element range
    assert {n: e.whole_tensors for n, e in BACKENDS.items()} == {"hf": False, "vllm": True, "sglang": True}
    with pytest.raises(ValueError, match="unknown rollout backend 'tgi'"):
        rollout_backend("tgi")


def test_reading_the_table_imports_neither_torch_nor_an_engine():
    # In a fresh interpreter: what importing the package and reading every entry loads, transitively.
    code = (
        "import json, sys\n"
        "from rl_engine.backends import BACKENDS, rollout_backend\n"
        "entries = [rollout_backend(name) for name in BACKENDS]\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'vllm', 'sglang'})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


@pytest.mark.parametrize("backend", ["hf", *standins.BACKENDS])
def test_the_entry_builds_the_backends_own_worker(backend, make_cfg, monkeypatch):
    from rl_engine.backends import build_rollout_worker
    from rl_engine.backends.hf.worker import HFRolloutWorker
    from rl_engine.backends.sglang.worker import SGLangRolloutWorker
    from rl_engine.backends.vllm.worker import VLLMRolloutWorker

    if backend != "hf":
        standins.install(backend, monkeypatch)
    more = () if backend == "hf" else ("resources.rollout_gpus=1",)
    worker = build_rollout_worker(make_cfg(f"rollout={{backend: {backend}, n: 2}}", "seed=5", *more), index=1)
    try:
        want = {"hf": HFRolloutWorker, "vllm": VLLMRolloutWorker, "sglang": SGLangRolloutWorker}[backend]
        assert type(worker) is want
    finally:
        worker.close()


def test_the_trainer_opens_each_backends_own_side_of_a_broadcast(monkeypatch):
    from rl_engine.backends.vllm import weights as vllm

    monkeypatch.setattr(GroupSender, "join", classmethod(lambda cls, init: ("group of broadcast.py", init)))
    monkeypatch.setattr(vllm.VllmSender, "join", classmethod(lambda cls, init: ("vLLM's NCCL group", init)))
    joined: dict = {}
    fake = types.ModuleType("sglang.srt.utils.common")
    fake.init_custom_process_group = lambda **kw: joined.update(kw) or "SGLang's group"
    monkeypatch.setitem(sys.modules, "sglang.srt.utils.common", fake)
    gloo, nccl = GroupInit("10.0.0.1", 29500, 3, 0, "gloo"), GroupInit("10.0.0.1", 29500, 3, 0, "nccl")

    assert rollout_backend("hf").open_sender(gloo) == ("group of broadcast.py", gloo)
    assert rollout_backend("vllm").open_sender(gloo) == ("group of broadcast.py", gloo)  # its workers join it
    assert rollout_backend("vllm").open_sender(nccl) == ("vLLM's NCCL group", nccl)
    sender = rollout_backend("sglang").open_sender(gloo)
    assert isinstance(sender, GroupSender) and sender.group == "SGLang's group"
    assert joined["init_method"] == "tcp://10.0.0.1:29500" and joined["group_name"] == WEIGHT_GROUP
    assert (joined["backend"], joined["rank"], joined["world_size"]) == ("gloo", 0, 3)


def backend_name_checks(source: str) -> list[int]:
    """Lines of ``source`` that compare something with a rollout backend's name (``==``, ``in``, ``case``)."""
    names, lines = set(BACKENDS), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            values = [e for o in operands for e in (o, *getattr(o, "elts", ()))]
            if any(isinstance(v, ast.Constant) and v.value in names for v in values):
                lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and getattr(node.value, "value", None) in names:
            lines.append(node.lineno)
    return sorted(lines)


def test_no_engine_code_but_the_config_compares_a_backend_name():
    offenders = {
        str(path.relative_to(REPO_ROOT)): lines
        for path in sorted((REPO_ROOT / "rl_engine").rglob("*.py"))
        if path.parent != REPO_ROOT / "rl_engine" / "config"  # its validators check a Literal field
        if (lines := backend_name_checks(path.read_text()))
    }
    assert offenders == {}, "dispatch on rollout.backend goes through rl_engine.backends"
    planted = (
        'if cfg.rollout.backend == "vllm":\n    pass\n'
        'whole = backend not in ("vllm", "sglang")\n'
        'match backend:\n    case "hf":\n        pass\n'
        'if backend == "gloo":\n    pass\n'
    )
    assert backend_name_checks(planted) == [1, 3, 5]

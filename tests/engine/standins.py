"""Install the ASYNCIO STAND-IN of one GPU engine (standin_vllm.py, standin_sglang.py) — not the engine."""

from __future__ import annotations

from typing import Any

from tests.engine import standin_sglang, standin_vllm

BACKENDS = ["vllm", "sglang"]


def install(backend: str, monkeypatch: Any) -> str:
    """Make ``import vllm`` / ``import sglang`` resolve to its stand-in; returns ``backend``."""
    if backend == "vllm":
        standin_vllm.install(monkeypatch)
    else:
        standin_sglang.install(monkeypatch)
        monkeypatch.setattr(standin_sglang.TokenizerManager, "pause_poll_s", 0.1)  # tests need no 1 s poll
    return backend

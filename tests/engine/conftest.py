"""Engine fixtures: one tiny model built per session, configs derived from the demo-cpu preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_engine.config import ExperimentConfig, TinyModelSpec, apply_overrides, parse_config
from rl_engine.models.tiny import save_tiny_model
from rl_engine.presets import get_preset


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(TinyModelSpec(seed=0), tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture
def make_cfg(tiny_model_dir: Path):
    """demo-cpu pointed at the session's tiny model, with ``a.b=c`` overrides."""

    def make(*overrides: str) -> ExperimentConfig:
        data = get_preset("demo-cpu")
        data["model"].pop("tiny")
        return parse_config(apply_overrides(data, [f"model.path={tiny_model_dir}", *overrides]))

    return make

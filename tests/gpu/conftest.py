"""GPU backend tests: skipped unless CUDA is available (and the backend's package is installed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_engine.config import TinyModelSpec
from rl_engine.models.tiny import save_tiny_model


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(TinyModelSpec(seed=0), tmp_path_factory.mktemp("gpu-models") / "tiny")

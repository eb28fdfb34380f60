"""The actors' message types load without the heavy stack (the platform side may import them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.smoke
def test_the_message_module_imports_neither_torch_nor_ray():
    code = (
        "import sys, rl_engine.types\n"
        "print(sorted(m for m in ('torch', 'ray', 'numpy', 'transformers') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"

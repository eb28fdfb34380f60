"""A TEST FIXTURE, not a reward: ``rlp_units_test_fixture`` misbehaves on purpose so that the engine's
tests reach its plugin error paths through a real entry point. Never name it in a run."""

from __future__ import annotations

import threading
from typing import Any


def misbehave(behaviour: str = "hang", seconds: float = 600.0) -> Any:
    """Test fixture: hangs (``seconds``), raises or returns NaN on every sample, as ``behaviour`` says."""
    if behaviour not in ("hang", "raise", "nan"):
        raise ValueError("behaviour must be one of hang, raise, nan")

    def fn(sample: Any) -> float:
        if behaviour == "hang":
            threading.Event().wait(seconds)  # sleeps, holding nothing; ends on its own eventually
            return 1.0
        if behaviour == "raise":
            raise RuntimeError("the fixture raises, as asked")
        return float("nan")

    return fn

"""Ray pipeline: Rollouter(s), MessageQueue, Trainer and ParameterSync; modes sync / one_step_off /
fully_async as knobs of one code path. Entry point: ``run_experiment(cfg, sink)`` (``driver``).

Re-exported lazily (on first use, PEP 562): importing a module of this package must not import Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_engine.pipeline.driver import RunSummary, run_experiment
    from rl_engine.pipeline.watch import PipelineError

_WHERE = {"run_experiment": "driver", "RunSummary": "driver", "PipelineError": "watch"}

__all__ = ["PipelineError", "RunSummary", "run_experiment"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)

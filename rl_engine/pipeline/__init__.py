"""Ray pipeline: Rollouter(s), MessageQueue, Trainer and ParameterSync; modes sync / one_step_off /
fully_async as knobs of one code path. Entry point: ``run_experiment(cfg, sink)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_engine.pipeline.driver import RunSummary

__all__ = ["PipelineError", "RunSummary", "run_experiment"]


def run_experiment(
    cfg: Any, sink: Any, *, placement: Any = None, stop_event: Any = None, components: Any = None
) -> RunSummary:
    """Lazy wrapper so ``import rl_engine.pipeline`` does not import Ray (see ``driver.run_experiment``)."""
    from rl_engine.pipeline.driver import run_experiment as _run

    return _run(cfg, sink, placement=placement, stop_event=stop_event, components=components)


def __getattr__(name: str) -> Any:
    if name == "RunSummary":
        from rl_engine.pipeline.driver import RunSummary

        return RunSummary
    if name == "PipelineError":
        from rl_engine.pipeline.watch import PipelineError

        return PipelineError
    raise AttributeError(name)

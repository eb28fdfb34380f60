"""What every rollout backend shares: the worker contract (``base.RolloutWorker``), the helpers every
worker uses to build its samples (``common``) and the HF worker's sampling (``sampling``), the engine
workers' common half (``async_worker.AsyncEngineWorker`` on an ``engine_loop.EngineLoop`` thread), and
the rollouter's allocator setting (``heap``).

The backends themselves (the HF, vLLM and SGLang workers) live in ``rl_engine.backends``, which builds a
run's worker (``build_rollout_worker``); nothing here imports a backend, and of ``rl_engine.weights`` the
worker contract names only the bucket types (a type-only import).
"""

from rl_engine.rollout.base import RolloutWorker

__all__ = ["RolloutWorker"]

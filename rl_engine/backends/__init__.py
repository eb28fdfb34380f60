"""The rollout backends, grouped by engine: one folder each (``hf``, ``vllm``, ``sglang``), holding the
backend's worker (``worker.py``) and its two halves of weight sync (``weights.py``: the worker's
receiving half and the trainer's ``open_sender``).

They stand on the two shared packages below them: ``rl_engine.rollout`` (the worker contract and what
every worker shares) and ``rl_engine.weights`` (the bucket format and the transports); neither of those
imports a backend. ``registry`` is the one table keyed by ``rollout.backend`` (``BACKENDS``,
``rollout_backend``) and ``build_rollout_worker`` builds a run's worker from it. Reading the table
imports no engine and no torch: each entry imports its backend's modules when called.
"""

from rl_engine.backends.registry import (
    BACKENDS,
    RolloutBackend,
    build_rollout_worker,
    rollout_backend,
    rollout_seed,
)

__all__ = ["BACKENDS", "RolloutBackend", "build_rollout_worker", "rollout_backend", "rollout_seed"]

"""Decoupled rollout / trainer engine for asynchronous RL post-training of language models.

Imports nothing from Django or platform/. Run alone: ``python -m rl_engine train --config cfg.yaml``.
"""

__version__ = "0.1.0"

"""The policy update: losses from ``rl_engine.algos``, optimizer, schedule, checkpoint/resume."""

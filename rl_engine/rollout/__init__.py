"""Rollout workers: one standalone class per backend behind the contract in ``base``."""

"""Algorithms as pure tensor functions, picked by name from registries (see docs/engine.md for formulas):
advantage estimators in ``advantages`` (importable without torch: the config reads its names), policy
losses and their aggregation in ``losses``. Import them from those modules; this package re-exports
nothing, so that importing one does not import the other (and torch)."""

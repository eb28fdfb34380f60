"""Multi-turn environments (docs/engine.md, "Environments"): the contract (``base``), the built-ins
(``feedback``; ``calculator`` with its safe evaluator ``arithmetic``), token-exact episodes over any
rollout worker (``episodes``, ``chat_turns``) and the registry ``env.name`` names them from
(``registry``)."""

"""Weight sync, trainer → rollout workers: the parts every backend shares (docs/pipeline.md, "Weight sync").

* ``buckets``: the bucket format every transport carries and every worker loads.
* ``object_store`` and ``broadcast``: the two transports (the Ray object store; a rank-0 broadcast
  over a private torch.distributed group, ``gloo`` or ``nccl``).
* ``sync``: ``ParameterSync``, the driver's side (which transport, when, timed).

Each backend's own two halves — the trainer's sending half (``open_sender``) and the worker's
receiving half — live with its worker in ``rl_engine.backends`` (``backends/<engine>/weights.py``), as
does the one table keyed by rollout backend (``rl_engine.backends.registry``). Nothing here imports a
backend or ``rl_engine.rollout``.
"""

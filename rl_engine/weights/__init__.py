"""Weight sync, trainer → rollout workers, in one room (docs/pipeline.md, "Weight sync").

* ``buckets``: the bucket format every transport carries and every worker loads.
* ``object_store`` and ``broadcast``: the two transports (the Ray object store; a rank-0 broadcast
  over a private torch.distributed group, ``gloo`` or ``nccl``).
* ``sync``: ``ParameterSync``, the driver's side (which transport, when, timed).
* ``hf``, ``vllm``, ``sglang``: each rollout backend's two halves side by side — the trainer's sending
  half and the worker's receiving half (the receiving half still runs where the worker does: the HF
  rollouter's actor, vLLM's worker processes through ``VLLMWorkerExtension``, SGLang's engine).
* ``registry``: the one table keyed by rollout backend (how its worker is built, how the trainer
  sends to it, whether its buckets hold whole tensors); nothing else compares the backend's name.
"""

"""The vLLM backend: ``worker`` is ``VLLMRolloutWorker`` (``AsyncLLM`` on the worker's own engine loop,
on a GPU or vLLM's CPU build; vllm is imported lazily) and ``weights`` its weight sync, both halves
(``VllmWeights``, the worker's receiving half; ``VLLMWorkerExtension``, mixed into vLLM's worker
processes through ``worker_extension_cls`` as ``rl_engine.backends.vllm.weights.VLLMWorkerExtension``;
``open_sender``, the trainer's side of a broadcast, vLLM's NCCL group or a gloo group).
"""

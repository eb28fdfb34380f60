"""The SGLang backend (GPU only): ``worker`` is ``SGLangRolloutWorker`` (``sglang.Engine`` driven by
coroutines on the worker's own engine loop; sglang is imported lazily) and ``weights`` its weight sync,
both halves (``SglangWeights``, the worker's receiving half, one checked call per bucket; ``open_sender``,
the trainer's side of a broadcast, joined with SGLang's own ``init_custom_process_group``).
"""

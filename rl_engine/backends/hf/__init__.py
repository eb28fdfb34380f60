"""The HF transformers backend: ``worker`` is ``HFRolloutWorker`` (its own KV-cache decode loop, in the
rollouter's process, on CPU or a GPU) and ``weights`` its weight sync, both halves (``HFWeights``, the
worker's receiving half, which loads any element range into the worker's flat parameter buffer, and
``open_sender``, the trainer's side of a broadcast over ``rl_engine.weights.broadcast``'s group).
"""

"""SGLang rollout worker (GPU only; written against SGLang 0.5.23 as documented in GPU_BACKENDS.md).

sglang is imported lazily; the pure helpers (sampling params, output conversion) are unit-tested on
CPU. SGLang returns log-probs after temperature by default, which is the engine-wide convention, so
nothing needs reconfiguring (never set SGLANG_RETURN_ORIGINAL_LOGPROB).

Partial rollout: ``interrupt()`` pauses generation in abort mode through the engine's tokenizer
manager (pause/abort are not ``Engine`` methods in this release); aborted requests come back with their
partial ``output_ids`` and log-probs and finish type ``abort``. Weights: ``update_weights_from_tensor``
for named tensors (CUDA IPC), or the NCCL group path (``init_weight_transfer`` / ``receive_weights``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from rl_engine.config import ModelConfig, SGLangRolloutConfig
from rl_engine.rollout.base import RolloutWorker
from rl_engine.rollout.common import extend_sample, needs_continuation, normalise_finish, sample_template
from rl_engine.types import FinishReason, Prompt, Sample


def sampling_params(cfg: SGLangRolloutConfig, max_new_tokens: int, eos_ids: list[int]) -> dict[str, Any]:
    """The ``sampling_params`` dict of one request (n=1: the worker expands groups itself)."""
    return {
        "n": 1,
        "max_new_tokens": max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "stop_token_ids": list(eos_ids),
    }


def convert_output(out: dict[str, Any], eos_ids: list[int]) -> tuple[list[int], list[float], FinishReason]:
    """One ``Engine.generate`` result -> (token ids, sampled-token log-probs, finish reason).

    ``meta_info["output_token_logprobs"]`` holds ``(logprob, token_id, text)`` per generated token.
    """
    ids = [int(t) for t in out.get("output_ids", [])]
    meta = out.get("meta_info", {})
    triples = meta.get("output_token_logprobs") or []
    if len(triples) != len(ids):
        raise ValueError(f"SGLang returned {len(triples)} log-prob entries for {len(ids)} tokens")
    for (_, tok, *_rest), want in zip(triples, ids, strict=True):
        if int(tok) != want:
            raise ValueError("SGLang log-prob entries do not follow output_ids")
    lps = [float(lp) for lp, *_ in triples]
    reason = (meta.get("finish_reason") or {}).get("type")
    return ids, lps, normalise_finish(reason, ids[-1] if ids else None, eos_ids)


class SGLangRolloutWorker(RolloutWorker):
    """Rollout on ``sglang.Engine``; see the module docstring."""

    def __init__(self, rollout_cfg: SGLangRolloutConfig, model_cfg: ModelConfig, *, seed: int = 0):
        super().__init__()
        import sglang

        from rl_engine.models import ensure_model, load_tokenizer, special_token_ids

        self.cfg = rollout_cfg
        path = ensure_model(model_cfg)
        self.tokenizer = load_tokenizer(model_cfg)
        self.special = special_token_ids(model_cfg, self.tokenizer)
        self.engine = sglang.Engine(
            model_path=str(path),
            tp_size=rollout_cfg.tp_size,
            dtype=model_cfg.dtype,
            mem_fraction_static=rollout_cfg.mem_fraction_static,
            random_seed=seed,
            skip_tokenizer_init=True,  # token ids in, token ids out: the worker owns the tokenizer
            trust_remote_code=model_cfg.trust_remote_code,
        )

    def _run(self, samples: list[Sample]) -> list[Sample]:
        if not samples:
            return []
        if self.interrupted:
            return [
                extend_sample(
                    s, [], [], "abort", version=self.version, elapsed_s=0.0, tokenizer=self.tokenizer
                )
                for s in samples
            ]
        t0 = time.perf_counter()
        outs = self.engine.generate(
            input_ids=[s.prompt_ids + s.response_ids for s in samples],
            sampling_params=[
                sampling_params(self.cfg, self.cfg.max_new_tokens - len(s.response_ids), self.special.eos_ids)
                for s in samples
            ],
            return_logprob=True,
        )
        dt = time.perf_counter() - t0
        return [
            extend_sample(
                s,
                *convert_output(o, self.special.eos_ids),
                version=self.version,
                elapsed_s=dt,
                tokenizer=self.tokenizer,
            )
            for s, o in zip(samples, outs, strict=True)
        ]

    def generate(self, prompts: list[Prompt], n: int) -> list[Sample]:
        return self._run([sample_template(p, self.version) for p in prompts for _ in range(n)])

    def resume(self, samples: list[Sample]) -> list[Sample]:
        todo = [i for i, s in enumerate(samples) if needs_continuation(s, self.cfg.max_new_tokens)]
        out = list(samples)
        for i, s in zip(todo, self._run([samples[i] for i in todo]), strict=True):
            out[i] = s
        return out

    def _on_engine_loop(self, coro: Any) -> Any:
        # The tokenizer manager lives on the engine's event loop. While generate() blocks in it (the
        # interrupt case, called from another thread) submit thread-safely; when idle, run it here.
        loop = self.engine.loop
        if loop.is_running():
            return asyncio.run_coroutine_threadsafe(coro, loop).result()
        return loop.run_until_complete(coro)

    def interrupt(self) -> None:
        from sglang.srt.managers.io_struct import PauseGenerationReqInput

        super().interrupt()
        self._on_engine_loop(
            self.engine.tokenizer_manager.pause_generation(PauseGenerationReqInput(mode="abort"))
        )

    def clear_interrupt(self) -> None:
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput

        super().clear_interrupt()
        self._on_engine_loop(self.engine.tokenizer_manager.continue_generation(ContinueGenerationReqInput()))

    def update_weights(self, named_tensors: Mapping[str, Any], version: int) -> None:
        import torch

        tensors = [(k, torch.as_tensor(v).cuda()) for k, v in named_tensors.items()]
        self.engine.update_weights_from_tensor(named_tensors=tensors, flush_cache=True)
        self._version = int(version)

    def init_weight_transfer(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "rl_engine_weights",
    ) -> None:
        self.engine.init_weights_update_group(
            master_address=master_address,
            master_port=master_port,
            rank_offset=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend="nccl",
        )

    def receive_weights(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        version: int,
        group_name: str = "rl_engine_weights",
    ) -> None:
        """Receive one broadcast from the trainer (set NCCL_CUMEM_ENABLE=0, NCCL_NVLS_ENABLE=0)."""
        self.engine.update_weights_from_distributed(
            names=names, dtypes=dtypes, shapes=shapes, group_name=group_name, flush_cache=True
        )
        self._version = int(version)

    def close(self) -> None:
        self.engine.shutdown()

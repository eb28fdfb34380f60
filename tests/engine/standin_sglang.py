"""ASYNCIO STAND-IN for SGLang 0.5.23 ``sglang.Engine`` and its tokenizer manager — NOT the engine.

Installed as a fake ``sglang`` package (``install(monkeypatch)``) so the real worker runs unchanged.
It reproduces, from the released source (docs/engine.md, "SGLang 0.5.23"):

* loop ownership: the engine adopts the loop current at construction; its synchronous methods run
  ``loop.run_until_complete`` (the loop runs only during such a call);
* ``pause_generation(mode="abort")``: under the pause condition, abort every request in the
  scheduler, then poll every ``pause_poll_s`` until no request holds the model-update lock;
* a request arriving while paused waits at the pause gate until ``continue_generation``;
* weight updates load only between ``begin_weight_update`` and ``end_weight_update`` and answer
  ``(success, message)``; ``update_weights_from_distributed`` with ``flattened_bucket`` receives one
  broadcast of the bucket's bytes (here over the rl_engine gloo transport: the stand-in has no NCCL).

Decoding is deterministic (see standin_vllm.StandInModel).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import pickle
from dataclasses import dataclass, field
from typing import Any

import torch

from tests.engine.standin_vllm import STEP_S, StandInModel, _token


@dataclass(kw_only=True)
class PauseGenerationReqInput:
    mode: str = "abort"


@dataclass(kw_only=True)
class ContinueGenerationReqInput:
    torch_empty_cache: bool = True


@dataclass(kw_only=True)
class BeginWeightUpdateReqInput:
    selector: str = "all"


@dataclass(kw_only=True)
class EndWeightUpdateReqInput:
    pass


@dataclass(kw_only=True)
class UpdateWeightsFromTensorReqInput:
    serialized_named_tensors: list[bytes]
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


@dataclass(kw_only=True)
class UpdateWeightsFromDistributedReqInput:
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None


@dataclass(kw_only=True)
class InitWeightsUpdateGroupReqInput:
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


@dataclass
class FlushCacheReqOutput:
    success: bool
    message: str = ""


class _RWLock:
    """The model-update lock: many readers (requests) or one writer (a weight update)."""

    def __init__(self) -> None:
        self.readers = 0
        self.writer = False
        self.cond = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def reader_lock(self):
        async with self.cond:
            await self.cond.wait_for(lambda: not self.writer)
            self.readers += 1
        try:
            yield
        finally:
            async with self.cond:
                self.readers -= 1
                self.cond.notify_all()

    @contextlib.asynccontextmanager
    async def writer_lock(self):
        async with self.cond:
            await self.cond.wait_for(lambda: not self.writer and not self.readers)
            self.writer = True
        try:
            yield
        finally:
            async with self.cond:
                self.writer = False
                self.cond.notify_all()

    async def is_locked(self) -> bool:
        return self.writer or self.readers > 0


@dataclass
class _Req:
    rid: str
    ids: list[int]
    params: dict[str, Any]
    in_scheduler: bool = False
    abort: bool = False
    out: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)


class TokenizerManager:
    pause_poll_s = 1.0  # SGLang polls every 1 s while aborted requests drain

    def __init__(self, model: StandInModel) -> None:
        self.model = model
        self.is_pause = False
        self.is_pause_cond = asyncio.Condition()
        self.model_update_lock = _RWLock()
        self.rid_to_state: dict[str, _Req] = {}
        self.session = False
        self.group: Any = None
        self.weight_version: str | None = None
        self.calls: list[str] = []

    async def generate_request(self, obj: dict[str, Any], request: Any = None):
        single = isinstance(obj["input_ids"][0], int)
        batch = [obj["input_ids"]] if single else obj["input_ids"]
        params = (
            [obj["sampling_params"]] * len(batch)
            if isinstance(obj["sampling_params"], dict)
            else obj["sampling_params"]
        )
        rids = (
            [obj.get("rid") or f"auto{id(obj)}-{i}" for i in range(len(batch))]
            if not single or not obj.get("rid")
            else [obj["rid"]]
        )
        reqs = [_Req(r, list(ids), p) for r, ids, p in zip(rids, batch, params, strict=True)]
        for r in reqs:
            self.rid_to_state[r.rid] = r
        try:
            async with self.is_pause_cond:
                await self.is_pause_cond.wait_for(lambda: not self.is_pause)
            async with self.model_update_lock.reader_lock():
                outs = await asyncio.gather(*(self._decode(r) for r in reqs))
        finally:
            for r in reqs:
                self.rid_to_state.pop(r.rid, None)
        yield outs[0] if single else outs

    async def _decode(self, r: _Req) -> dict[str, Any]:
        r.in_scheduler = True
        reason = None
        while reason is None:
            await asyncio.sleep(STEP_S)
            if r.abort:
                reason = "abort"
                break
            tok = _token(len(r.ids), len(r.out))
            r.out.append(tok)
            r.lps.append(self.model.logprob())
            if tok in r.params.get("stop_token_ids", []):
                reason = "stop"
            elif len(r.out) >= r.params["max_new_tokens"]:
                reason = "length"
        return {
            "output_ids": list(r.out),
            "meta_info": {
                "output_token_logprobs": [(lp, t, None) for lp, t in zip(r.lps, r.out, strict=True)],
                "finish_reason": {"type": reason},
                "weight_version": self.weight_version,
            },
        }

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        for r in list(self.rid_to_state.values()):
            if r.in_scheduler and (abort_all or r.rid == rid):
                r.abort = True

    async def pause_generation(self, obj: PauseGenerationReqInput) -> None:
        self.calls.append("pause_generation")
        async with self.is_pause_cond:
            self.is_pause = True
            while True:
                self.abort_request(abort_all=True)
                if not await self.model_update_lock.is_locked():
                    break
                await asyncio.sleep(self.pause_poll_s)

    async def continue_generation(self, obj: ContinueGenerationReqInput) -> None:
        self.calls.append("continue_generation")
        async with self.is_pause_cond:
            self.is_pause = False
            self.is_pause_cond.notify_all()

    async def _exclusive(self, fn: Any) -> tuple[bool, str]:
        async with self.is_pause_cond:
            paused = self.is_pause
            if paused:
                result = await fn()
        if not paused:
            async with self.model_update_lock.writer_lock():
                result = await fn()
        return result

    async def begin_weight_update(
        self, obj: BeginWeightUpdateReqInput, request: Any = None
    ) -> tuple[bool, str]:
        async def run() -> tuple[bool, str]:
            self.session = True
            return True, "ok"

        return await self._exclusive(run)

    async def end_weight_update(self, obj: EndWeightUpdateReqInput, request: Any = None) -> tuple[bool, str]:
        async def run() -> tuple[bool, str]:
            was, self.session = self.session, False
            return (True, "ok") if was else (False, "no weight-update session is open")

        return await self._exclusive(run)

    def _load(self, named: list[tuple[str, torch.Tensor]], version: str | None) -> tuple[bool, str]:
        if not self.session:
            return False, "update_weights must run between begin_weight_update() and end_weight_update()"
        self.model.load_weights(named)
        if version is not None:
            self.weight_version = version
        return True, "Success"

    async def update_weights_from_tensor(
        self, obj: UpdateWeightsFromTensorReqInput, request: Any = None
    ) -> tuple[bool, str]:
        named = pickle.loads(obj.serialized_named_tensors[0])
        return await self._exclusive(lambda: _done(self._load(named, obj.weight_version)))

    async def init_weights_update_group(
        self, obj: InitWeightsUpdateGroupReqInput, request: Any = None
    ) -> tuple[bool, str]:
        if obj.backend != "gloo":
            return False, f"stand-in: backend {obj.backend!r} unavailable (no GPU), use gloo"
        from rl_engine.weights.broadcast import GroupInit, join_group

        init = GroupInit(
            obj.master_address, obj.master_port, obj.world_size, obj.rank_offset, "gloo", obj.group_name, 60.0
        )
        self.group = await asyncio.to_thread(join_group, init)
        return True, "Succeeded to initialize custom process group."

    async def update_weights_from_distributed(
        self, obj: UpdateWeightsFromDistributedReqInput, request: Any = None
    ) -> tuple[bool, str]:
        from rl_engine.weights.broadcast import broadcast_bytes
        from rl_engine.weights.buckets import unpack

        if not self.session:
            return (
                False,
                "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()",
            )
        if obj.load_format != "flattened_bucket":
            return False, "stand-in: only load_format='flattened_bucket' is modelled"
        # FlattenedTensorBucket.empty: one uint8 buffer of every tensor's bytes, back to back
        sizes = [
            math.prod(s) * getattr(torch, d).itemsize for d, s in zip(obj.dtypes, obj.shapes, strict=True)
        ]
        raw = torch.empty(sum(sizes), dtype=torch.uint8)
        await asyncio.to_thread(broadcast_bytes, self.group, raw)
        named = unpack(raw, obj.names, obj.dtypes, obj.shapes)
        return await self._exclusive(lambda: _done(self._load(named, obj.weight_version)))

    async def flush_cache(self) -> FlushCacheReqOutput:
        busy = await self.model_update_lock.is_locked()
        return FlushCacheReqOutput(success=not busy, message="requests running" if busy else "")


async def _done(value: Any) -> Any:
    return value


class Engine:
    """Stand-in for ``sglang.Engine`` (see the module docstring)."""

    instances: list[Engine] = []
    KWARGS = frozenset(
        [
            "model_path",
            "tokenizer_path",
            "tp_size",
            "dtype",
            "mem_fraction_static",
            "random_seed",
            "skip_tokenizer_init",
            "trust_remote_code",
            "json_model_override_args",
            "sampling_defaults",
        ]
    )

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - self.KWARGS
        if unknown:
            raise TypeError(f"ServerArgs got unexpected keyword arguments {sorted(unknown)}")
        self.kwargs = kwargs
        self.model = StandInModel()
        self.tokenizer_manager = TokenizerManager(self.model)
        self.loop = self._ensure_event_loop()
        Engine.instances.append(self)

    @staticmethod
    def _ensure_event_loop() -> asyncio.AbstractEventLoop:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            pass
        try:
            return asyncio.get_event_loop_policy().get_event_loop()
        except RuntimeError:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            return loop

    # coroutine API
    async def async_generate(
        self, input_ids=None, sampling_params=None, return_logprob=False, rid=None, **kw
    ):
        gen = self.tokenizer_manager.generate_request(
            {"input_ids": input_ids, "sampling_params": sampling_params, "rid": rid}, None
        )
        return await gen.__anext__()

    def _serialize_tensors_per_rank(
        self, tensors: list[tuple[str, torch.Tensor]], load_format: str | None
    ) -> list[bytes]:
        return [
            pickle.dumps([(n, t.cpu()) for n, t in tensors]) for _ in range(self.kwargs.get("tp_size", 1))
        ]

    # synchronous API: each call runs the engine's loop until it completes
    def generate(self, input_ids=None, sampling_params=None, return_logprob=False, **kw):
        gen = self.tokenizer_manager.generate_request(
            {"input_ids": input_ids, "sampling_params": sampling_params}, None
        )
        return self.loop.run_until_complete(gen.__anext__())

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        obj = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=self._serialize_tensors_per_rank(named_tensors, load_format),
            flush_cache=flush_cache,
        )
        return self.loop.run_until_complete(self.tokenizer_manager.update_weights_from_tensor(obj, None))

    def flush_cache(self):
        return self.loop.run_until_complete(self.tokenizer_manager.flush_cache())

    def shutdown(self) -> None:
        pass


def install(monkeypatch: Any) -> None:
    """Make ``import sglang`` (and ``sglang.srt.managers.io_struct``) resolve to this stand-in."""
    from tests.engine.standin_vllm import _install_modules

    Engine.instances.clear()
    io_struct = {
        c.__name__: c
        for c in (
            PauseGenerationReqInput,
            ContinueGenerationReqInput,
            BeginWeightUpdateReqInput,
            EndWeightUpdateReqInput,
            UpdateWeightsFromTensorReqInput,
            UpdateWeightsFromDistributedReqInput,
            InitWeightsUpdateGroupReqInput,
        )
    }
    parts = {
        "sglang": {"Engine": Engine},
        "sglang.srt": {},
        "sglang.srt.managers": {},
        "sglang.srt.managers.io_struct": io_struct,
    }
    _install_modules(monkeypatch, parts)

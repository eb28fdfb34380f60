"""Every engine class, method and parameter the vLLM and SGLang workers (and the trainer's side of a
broadcast weight sync, ``rl_engine/backends/vllm/weights.py`` and ``sglang/weights.py``) call, declared
in one place.

Test data, beside its one user: ``test_engine_api.py`` checks each entry against the *installed*
engine with ``inspect.signature`` (``make check-vllm`` / ``make check-sglang``, each in the engine's
own environment). Keyword sets that the workers build with helpers are derived from those helpers,
so they cannot drift from the calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rl_engine.config import ModelConfig, SGLangRolloutConfig, VLLMRolloutConfig


@dataclass(frozen=True)
class ApiUse:
    """``target`` = ``"module:Attr.attr"``; called with ``positional`` leading arguments (after
    ``self`` for a method) and these ``keywords``. ``kind``: call | coroutine | asyncgen | class."""

    target: str
    positional: int = 0
    keywords: tuple[str, ...] = ()
    kind: str = "call"
    method: bool = False  # looked up on a class, called on an instance (binds ``self``)
    values: dict[str, str] = field(default_factory=dict)  # keyword -> a literal value it must accept


def _model() -> ModelConfig:
    return ModelConfig(path="/m", override_config={"a": 1}, generation_config={"eos_token_id": 2})


def vllm_api() -> list[ApiUse]:
    from rl_engine.backends.vllm.worker import engine_kwargs, sampling_kwargs

    gpu, cpu = (engine_kwargs(VLLMRolloutConfig(device=d), _model(), "/m", 0) for d in ("cuda", "cpu"))
    engine = (*dict.fromkeys([*gpu, *cpu]), "weight_transfer_config")  # both devices' keywords
    llm = "vllm.v1.engine.async_llm:AsyncLLM."
    return [
        ApiUse("vllm:AsyncEngineArgs", keywords=engine, kind="class"),
        ApiUse("vllm.config:WeightTransferConfig", keywords=("backend",), kind="class"),
        ApiUse(
            "vllm:SamplingParams", keywords=tuple(sampling_kwargs(VLLMRolloutConfig(), 8, [2])), kind="class"
        ),
        ApiUse("vllm.exceptions:RetryableRequestError", kind="class"),
        ApiUse(llm + "from_engine_args", positional=1),
        ApiUse(llm + "generate", positional=3, kind="asyncgen", method=True),
        ApiUse(llm + "pause_generation", keywords=("mode", "clear_cache"), kind="coroutine", method=True),
        ApiUse(llm + "resume_generation", kind="coroutine", method=True),
        ApiUse(llm + "abort", positional=1, kind="coroutine", method=True),  # 0.32 queues late requests
        ApiUse(llm + "collective_rpc", positional=1, keywords=("args",), kind="coroutine", method=True),
        ApiUse(llm + "init_weight_transfer_engine", positional=1, kind="coroutine", method=True),
        ApiUse(llm + "start_weight_update", kind="coroutine", method=True),
        ApiUse(llm + "update_weights", positional=1, kind="coroutine", method=True),
        ApiUse(llm + "finish_weight_update", keywords=("weight_version",), kind="coroutine", method=True),
        ApiUse(llm + "reset_prefix_cache", kind="coroutine", method=True),
        ApiUse(llm + "shutdown", method=True),
        ApiUse(
            "vllm.distributed.weight_transfer.base:WeightTransferInitRequest",
            keywords=("init_info",),
            kind="class",
        ),
        ApiUse(
            "vllm.distributed.weight_transfer.base:WeightTransferUpdateRequest",
            keywords=("update_info",),
            kind="class",
        ),
        ApiUse(
            "vllm.distributed.weight_transfer.nccl_common:NCCLWeightTransferInitInfo",
            keywords=(
                "master_address",
                "master_port",
                "rank_offset",
                "world_size",
                "packed",
                "packed_buffer_size_bytes",
            ),
            kind="class",
        ),
        ApiUse(
            "vllm.distributed.weight_transfer.nccl_engine:NCCLWeightTransferUpdateInfo",
            keywords=("names", "dtype_names", "shapes"),
            kind="class",
        ),
        ApiUse("vllm.v1.worker.gpu_worker:Worker.get_model", method=True),  # the extension's host
        ApiUse(
            "vllm.model_executor.models.qwen2:Qwen2ForCausalLM.load_weights",
            keywords=("weights",),
            method=True,
        ),
        ApiUse(
            "vllm.model_executor.models.llama:LlamaForCausalLM.load_weights",
            keywords=("weights",),
            method=True,
        ),
        ApiUse("vllm.config.model:ModelConfig", kind="class", values={"logprobs_mode": "processed_logprobs"}),
        ApiUse(  # the extension's refresh of a tied lm_head after a weight update
            "vllm.model_executor.layers.vocab_parallel_embedding:UnquantizedEmbeddingMethod.process_weights_after_loading",
            positional=1,
            method=True,
        ),
        # the device check before the engine starts (rollout.device cpu needs the CPU build)
        ApiUse("vllm.platforms.interface:Platform.is_cpu", method=True),
        ApiUse("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackend.get_supported_head_sizes"),
        # the trainer's side of a broadcast sync (rl_engine/backends/vllm/weights.py)
        ApiUse("vllm.distributed.weight_transfer.nccl_common:trainer_init", positional=1, keywords=("rank",)),
        ApiUse(
            "vllm.distributed.device_communicators.pynccl:PyNcclCommunicator.broadcast",
            positional=1,
            keywords=("src", "stream"),
            method=True,
        ),
    ]


def sglang_api() -> list[ApiUse]:
    from rl_engine.backends.sglang.worker import engine_kwargs, sampling_params

    io = "sglang.srt.managers.io_struct:"
    tm = "sglang.srt.managers.tokenizer_manager:TokenizerManager."
    return [
        ApiUse(
            "sglang.srt.server_args:ServerArgs",
            keywords=tuple(engine_kwargs(SGLangRolloutConfig(), _model(), "/m", 0)),
            kind="class",
        ),
        ApiUse("sglang:Engine"),  # a lazy import of the class below
        ApiUse("sglang.srt.entrypoints.engine:Engine", kind="class"),
        ApiUse(
            "sglang.srt.entrypoints.engine:Engine.async_generate",
            keywords=("input_ids", "sampling_params", "return_logprob", "rid"),
            kind="coroutine",
            method=True,
        ),
        ApiUse("sglang.srt.entrypoints.engine:Engine._serialize_tensors_per_rank", positional=2, method=True),
        ApiUse("sglang.srt.entrypoints.engine:Engine.shutdown", method=True),
        ApiUse(
            "sglang.srt.sampling.sampling_params:SamplingParams",
            keywords=tuple(sampling_params(SGLangRolloutConfig(), 8, [2])),
            kind="class",
        ),
        ApiUse(tm + "pause_generation", positional=1, kind="coroutine", method=True),
        ApiUse(tm + "continue_generation", positional=1, kind="coroutine", method=True),
        ApiUse(tm + "begin_weight_update", positional=2, kind="coroutine", method=True),
        ApiUse(tm + "end_weight_update", positional=2, kind="coroutine", method=True),
        ApiUse(tm + "update_weights_from_tensor", positional=2, kind="coroutine", method=True),
        ApiUse(tm + "update_weights_from_distributed", positional=2, kind="coroutine", method=True),
        ApiUse(tm + "init_weights_update_group", positional=2, kind="coroutine", method=True),
        ApiUse(tm + "flush_cache", kind="coroutine", method=True),
        ApiUse(io + "PauseGenerationReqInput", keywords=("mode",), kind="class", values={"mode": "abort"}),
        ApiUse(io + "ContinueGenerationReqInput", kind="class"),
        ApiUse(io + "BeginWeightUpdateReqInput", kind="class"),
        ApiUse(io + "EndWeightUpdateReqInput", kind="class"),
        ApiUse(
            io + "UpdateWeightsFromTensorReqInput",
            keywords=("serialized_named_tensors", "flush_cache", "weight_version"),
            kind="class",
        ),
        ApiUse(
            io + "UpdateWeightsFromDistributedReqInput",
            keywords=(
                "names",
                "dtypes",
                "shapes",
                "group_name",
                "flush_cache",
                "load_format",
                "weight_version",
            ),
            kind="class",
        ),
        ApiUse(
            io + "InitWeightsUpdateGroupReqInput",
            keywords=("master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"),
            kind="class",
        ),
        ApiUse("sglang.srt.weight_sync.tensor_bucket:FlattenedTensorBucket.empty", positional=4),
        # the trainer's side of a broadcast sync (rl_engine/backends/sglang/weights.py)
        ApiUse(
            "sglang.srt.utils.common:init_custom_process_group",
            keywords=("backend", "init_method", "timeout", "world_size", "rank", "group_name"),
        ),
    ]

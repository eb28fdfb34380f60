"""The one configuration schema of an experiment (pydantic; imports neither torch nor ray).

- ``sections``: the sections (model, rollout, trainer, algorithm, pipeline, data, reward, resources,
  logging, eval); ``experiment``: ``ExperimentConfig``, the checks across sections, its JSON Schema;
- ``errors``: ``ConfigError`` (field path, message) and where a path prefix is added or removed;
- ``layout``: where the schema's unions and nested models sit, read from the models;
- ``validation``: a mapping validated, pydantic's errors as field paths;
- ``io``: YAML files, presets and ``--set`` overrides; ``merge``: partial configs merged in (sweeps, forks);
- ``lora``: ``model.lora`` (LoRA adapters) and the check of its target modules against a model;
- ``names``: the names a registry looks up (rewards, tasks, estimators...), torch-free;
- ``moved``: the fields that moved to the placement, still recognised until ``REMOVED_IN``.

Import from here: ``from rl_engine.config import ExperimentConfig, parse_config``.
"""

from rl_engine.config.errors import ConfigError, FieldError, joined, relative
from rl_engine.config.experiment import ExperimentConfig, experiment_json_schema
from rl_engine.config.io import apply_overrides, dump_yaml, load_yaml, parse_override, read_yaml, yaml_where
from rl_engine.config.lora import LoraConfig, unknown_targets
from rl_engine.config.merge import FORK_FIXED, dotted_get, fork_config, merge_config
from rl_engine.config.sections import (
    ESSENTIAL,
    LOGPROB_CONVENTION,
    RAY_BUILTIN_RESOURCES,
    SEED_LIMIT,
    AlgorithmConfig,
    DataConfig,
    DatasetColumns,
    DatasetDataConfig,
    EngineRolloutConfig,
    EvalConfig,
    HFRolloutConfig,
    JsonlDataConfig,
    LoggingConfig,
    MlflowConfig,
    ModelConfig,
    NodeResources,
    PipelineConfig,
    ReasoningGymDataConfig,
    ReasoningGymDatasetSpec,
    ResourcesConfig,
    RewardComponent,
    RewardConfig,
    RolloutConfig,
    SGLangRolloutConfig,
    SinkName,
    SyntheticDataSpec,
    TaskDataConfig,
    TextArenaDataConfig,
    TinyModelSpec,
    TrainerConfig,
    VLLMRolloutConfig,
    WandbConfig,
    has_validation_data,
)
from rl_engine.config.validation import parse_config, validation_errors

__all__ = [
    "ESSENTIAL",
    "FORK_FIXED",
    "LOGPROB_CONVENTION",
    "RAY_BUILTIN_RESOURCES",
    "SEED_LIMIT",
    "AlgorithmConfig",
    "ConfigError",
    "DataConfig",
    "DatasetColumns",
    "DatasetDataConfig",
    "EngineRolloutConfig",
    "EvalConfig",
    "ExperimentConfig",
    "FieldError",
    "HFRolloutConfig",
    "JsonlDataConfig",
    "LoggingConfig",
    "LoraConfig",
    "MlflowConfig",
    "ModelConfig",
    "NodeResources",
    "PipelineConfig",
    "ReasoningGymDataConfig",
    "ReasoningGymDatasetSpec",
    "ResourcesConfig",
    "RewardComponent",
    "RewardConfig",
    "RolloutConfig",
    "SGLangRolloutConfig",
    "SinkName",
    "SyntheticDataSpec",
    "TaskDataConfig",
    "TextArenaDataConfig",
    "TinyModelSpec",
    "TrainerConfig",
    "VLLMRolloutConfig",
    "WandbConfig",
    "apply_overrides",
    "dotted_get",
    "dump_yaml",
    "experiment_json_schema",
    "fork_config",
    "has_validation_data",
    "joined",
    "load_yaml",
    "merge_config",
    "parse_config",
    "parse_override",
    "read_yaml",
    "relative",
    "unknown_targets",
    "validation_errors",
    "yaml_where",
]

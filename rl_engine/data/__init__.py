"""Prompt streams over built-in seeded tasks, a JSONL file or a Hugging Face dataset; validation prompts.

The stream and the validation prompts are in ``stream``; rows, rendering and tasks in their modules.
"""

from rl_engine.data.render import PromptRenderer, has_chat_template
from rl_engine.data.rows import DataError, Row, load_jsonl
from rl_engine.data.stream import (
    PromptStream,
    extra_validation_prompts,
    make_renderer,
    train_rows,
    validation_prompts,
    validation_rows,
)
from rl_engine.data.tasks import TASKS, make_task, task_names

__all__ = [
    "TASKS",
    "DataError",
    "PromptRenderer",
    "PromptStream",
    "Row",
    "extra_validation_prompts",
    "has_chat_template",
    "load_jsonl",
    "make_renderer",
    "make_task",
    "task_names",
    "train_rows",
    "validation_prompts",
    "validation_rows",
]

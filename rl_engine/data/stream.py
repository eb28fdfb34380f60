"""The prompt stream over a run's data (built-in seeded task, JSONL file, Hugging Face dataset,
reasoning-gym mix or TextArena games) and its validation prompts.

``PromptStream(cfg, tokenizer)`` is what the pipeline checkpoints: its ``state_dict`` is a small
JSON-friendly dict (the cursor), so a resumed run continues the epoch where it stopped.
"""

from __future__ import annotations

import random
from typing import Any

from rl_engine.config import (
    DatasetDataConfig,
    ExperimentConfig,
    JsonlDataConfig,
    ReasoningGymDataConfig,
    TaskDataConfig,
    TextArenaDataConfig,
)
from rl_engine.data.render import PromptRenderer, Rendered
from rl_engine.data.rows import DataError, DatasetRows, Row, RowSource, TaskRows, jsonl_rows
from rl_engine.data.tasks import make_task
from rl_engine.types import Prompt


def train_rows(cfg: ExperimentConfig) -> RowSource:
    data = cfg.data
    if isinstance(data, TaskDataConfig):
        return TaskRows(make_task(data.task, data.task_kwargs), data.task, cfg.seed, data.num_prompts)
    if isinstance(data, JsonlDataConfig):
        return jsonl_rows(data.path, data.prompt_field, data.answer_field)
    if isinstance(data, ReasoningGymDataConfig):
        from rl_engine.data.reasoning_gym import train_split

        return train_split(data)
    if isinstance(data, TextArenaDataConfig):
        from rl_engine.data.textarena_games import train_split as games

        return games(data)
    from rl_engine.data.hf_datasets import load_train_split

    return DatasetRows(load_train_split(data), data.columns, f"{data.path} split {data.train_split!r}")


def validation_rows(cfg: ExperimentConfig) -> RowSource | None:
    """The held-out rows of ``cfg.data``, or None when it has none."""
    data = cfg.data
    if isinstance(data, TaskDataConfig):
        if not data.num_validation_prompts:
            return None
        fn = make_task(data.task, data.task_kwargs)
        return TaskRows(fn, data.task, cfg.seed, data.num_validation_prompts, stream="validation")
    if isinstance(data, JsonlDataConfig):
        return (
            jsonl_rows(data.validation_path, data.prompt_field, data.answer_field)
            if data.validation_path
            else None
        )
    if isinstance(data, ReasoningGymDataConfig):
        from rl_engine.data.reasoning_gym import held_out_split

        return held_out_split(data)
    if isinstance(data, TextArenaDataConfig):
        from rl_engine.data.textarena_games import held_out_split as held_out_games

        return held_out_games(data)
    from rl_engine.data.hf_datasets import load_validation_split

    ds = load_validation_split(data)
    if ds is None:
        return None
    where = data.validation_path or f"{data.path} split {data.validation_split!r}"
    return DatasetRows(ds, data.columns, where)


def make_renderer(cfg: ExperimentConfig, tokenizer: Any) -> PromptRenderer:
    data = cfg.data
    extra: dict[str, Any] = {}
    if isinstance(data, DatasetDataConfig | ReasoningGymDataConfig | TextArenaDataConfig):
        extra = {
            "chat_template": data.chat_template,
            "prompt_template": data.prompt_template,
            "system_prompt": data.system_prompt,
        }
    return PromptRenderer(
        tokenizer,
        max_tokens=cfg.rollout.max_prompt_tokens,
        overlong=data.overlong_prompts,
        truncation_side=data.truncation_side,
        **extra,
    )


def _prompt(uid: str, index: int, row: Row, rendered: Rendered) -> Prompt:
    return Prompt(
        uid=uid,
        token_ids=rendered.token_ids,
        text=rendered.text,
        answer=row.answer,
        index=index,
        metadata=dict(row.metadata),
    )


class PromptStream:
    """An endless, deterministic stream of prompts over a row source.

    Position ``i`` is row ``order_e[i % size]`` of epoch ``e = i // size``: tasks keep their order (each
    example is already random), JSONL files and datasets are shuffled per epoch from (seed, epoch) unless
    ``data.shuffle`` is off. Overlong rows that the policy drops are skipped (the position still moves,
    so the skip is the same after a resume). The state is the cursor: ``state_dict``/``load_state_dict``.
    """

    def __init__(self, cfg: ExperimentConfig, tokenizer: Any, rows: RowSource | None = None):
        self._rows = rows if rows is not None else train_rows(cfg)
        self._size = len(self._rows)
        self._seed = cfg.seed
        self._shuffle = not isinstance(cfg.data, TaskDataConfig) and getattr(cfg.data, "shuffle", True)
        self.renderer = make_renderer(cfg, tokenizer)
        self._position = 0
        self._epoch_order: tuple[int, list[int]] | None = None

    def __len__(self) -> int:
        """Distinct examples per epoch."""
        return self._size

    @property
    def position(self) -> int:
        return self._position

    @property
    def epoch(self) -> int:
        return self._position // self._size

    def _row_index(self, i: int) -> int:
        epoch, j = divmod(i, self._size)
        if not self._shuffle:
            return j
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            order = list(range(self._size))
            random.Random(f"{self._seed}:epoch:{epoch}").shuffle(order)
            self._epoch_order = (epoch, order)
        return self._epoch_order[1][j]

    def next_batch(self, k: int) -> list[Prompt]:
        """The next ``k`` prompts; advances the position past them (and past dropped overlong rows)."""
        out: list[Prompt] = []
        skipped = 0
        while len(out) < k:
            i = self._position
            j = self._row_index(i)
            row = self._rows.row(j)
            rendered = self.renderer.render(row, where=f"row {j}")
            self._position += 1
            if rendered is None:
                skipped += 1
                if skipped >= self._size:
                    raise DataError(
                        f"every prompt is longer than rollout.max_prompt_tokens={self.renderer.max_tokens}: "
                        "raise it or set data.overlong_prompts=truncate"
                    )
                continue
            skipped = 0
            out.append(_prompt(f"p{i}", i, row, rendered))
        return out

    def stats(self) -> dict[str, float]:
        """Figures for the step metrics: overlong prompts so far (this stream's count) and the epoch."""
        return {"data/overlong_prompts": float(self.renderer.overlong), "data/epoch": float(self.epoch)}

    def state_dict(self) -> dict[str, int]:
        return {"position": self._position, "rows": self._size, "overlong": self.renderer.overlong}

    def load_state_dict(self, state: dict[str, int]) -> None:
        rows = state.get("rows")
        if rows is not None and int(rows) != self._size:
            raise DataError(
                f"the checkpoint's prompt stream had {rows} rows per epoch, this data has {self._size}: "
                "resuming would repeat or skip prompts (resume with the same data)"
            )
        self._position = int(state["position"])
        self.renderer.overlong = int(state.get("overlong", 0))


def validation_prompts(cfg: ExperimentConfig, tokenizer: Any, max_prompts: int | None = None) -> list[Prompt]:
    """The held-out prompts, in dataset order (uids ``v0``, ``v1``...); overlong ones follow the same
    policy as training prompts. Empty when the data has no validation part."""
    rows = validation_rows(cfg)
    if rows is None:
        return []
    return _render_rows(cfg, tokenizer, rows, "v", "validation row", max_prompts)


def extra_validation_prompts(
    cfg: ExperimentConfig, tokenizer: Any, max_prompts: int | None = None
) -> dict[str, list[Prompt]]:
    """The prompts of each of ``data.extra_validation_splits``, by split, in dataset order (uids
    ``<split>/v0``...), rendered as the validation prompts are; empty for data without such splits."""
    data = cfg.data
    if not isinstance(data, DatasetDataConfig) or not data.extra_validation_splits:
        return {}
    from rl_engine.data.hf_datasets import load_named_split

    out: dict[str, list[Prompt]] = {}
    for split in data.extra_validation_splits:
        rows = DatasetRows(load_named_split(data, split), data.columns, f"{data.path} split {split!r}")
        prompts = _render_rows(cfg, tokenizer, rows, f"{split}/v", f"{split} row", max_prompts)
        if not prompts:
            raise DataError(
                f"{data.path} split {split!r}: no prompt to evaluate (data.extra_validation_splits)"
            )
        out[split] = prompts
    return out


def _render_rows(
    cfg: ExperimentConfig, tokenizer: Any, rows: RowSource, uid: str, where: str, max_prompts: int | None
) -> list[Prompt]:
    renderer = make_renderer(cfg, tokenizer)
    out: list[Prompt] = []
    for j in range(len(rows)):
        if max_prompts is not None and len(out) >= max_prompts:
            break
        row = rows.row(j)
        rendered = renderer.render(row, where=f"{where} {j}")
        if rendered is not None:
            out.append(_prompt(f"{uid}{j}", j, row, rendered))
    return out

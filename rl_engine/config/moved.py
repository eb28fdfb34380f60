"""The fields that moved out of ``ExperimentConfig`` into the job's placement (``rl_engine.jobspec``):
where a run runs, not what it trains. One table, read by

- the config (``experiment``, ``validation``): a config that still sets one is refused with a message
  naming its new place, except where it holds the value a normalised config stored when it was unset
  (an export made before the move still imports);
- the CLI (``rl_engine.cli``): a standalone user's YAML (or ``--set``) that still sets one has it lifted
  into the placement, with a one-line notice naming the flag to use instead.

This compatibility goes in release :data:`REMOVED_IN`: a test fails once the project's version
(``pyproject.toml``) reaches it. Removing it: delete this module and its uses (the lifting in
``rl_engine.cli.load_job``, ``ExperimentConfig._drop_unset_moved``, the message in
``validation.validation_errors``, docs/engine.md "Configs from before the split" and their tests); a
moved field is then an unknown field like any other. The platform's data migration (experiments 0003)
keeps its own copy of the paths and stays. Standard library only.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

# The release that drops this compatibility (``pyproject.toml``'s ``project.version``).
REMOVED_IN = "0.2.0"


@dataclass(frozen=True)
class MovedField:
    path: str  # where it was in the config, dotted
    placement: str  # the Placement attribute that holds it now
    flag: str  # the CLI flag that sets it
    old_default: Any  # what a normalised config stored when it was not set

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.path.split("."))


MOVED: tuple[MovedField, ...] = (
    MovedField("trainer.checkpoint_dir", "checkpoint_dir", "--checkpoint-dir", None),
    MovedField("trainer.resume_from", "resume_from", "--resume-from", None),
    MovedField("pipeline.ray_address", "ray_address", "--ray-address", None),
    MovedField("logging.jsonl_path", "jsonl_path", "--jsonl-path", None),
    MovedField("logging.progress_bar", "progress_bar", "--no-progress-bar", True),
    MovedField("logging.mlflow.artifact_location", "mlflow_artifact_location", "--mlflow-artifact-location", None),
    MovedField("logging.wandb.dir", "wandb_dir", "--wandb-dir", None),
)  # fmt: skip
BY_PATH: dict[str, MovedField] = {f.path: f for f in MOVED}


def moved_message(field: MovedField) -> str:
    """Why a config that sets ``field`` is refused (the config's error at that field)."""
    return (
        f"moved out of the config: it says where a run runs (its placement), not what it trains; the "
        f"platform sets it for every run, the engine's CLI takes {field.flag}"
    )


def split_moved(data: Any, *, keep_non_default: bool = False) -> tuple[Any, list[tuple[MovedField, Any]]]:
    """A copy of a config mapping without the moved fields, and those that held another value than their
    old default, in table order. ``keep_non_default``: leave those in the copy (for the config to refuse
    them at their path) and drop only the defaults. Anything that is not a mapping comes back as it is."""
    if not isinstance(data, dict):
        return data, []
    out = copy.deepcopy(data)
    given: list[tuple[MovedField, Any]] = []
    for field in MOVED:
        *parents, last = field.parts
        node: Any = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or last not in node:
            continue
        value = node[last]
        if value != field.old_default:
            given.append((field, value))
            if keep_non_default:
                continue
        del node[last]
    return out, given

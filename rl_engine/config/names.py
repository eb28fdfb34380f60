"""Every name a config may hold that an engine registry looks up, listed torch-free: the config checks
against these lists (a misspelt name is a field error when the config is validated, an HTTP 400 on the
platform, never a failure inside the job) and its JSON Schema offers them (the form's dropdowns).

The implementations stay in their registries (``rl_engine.rewards.registry.REWARDS``,
``rl_engine.data.tasks.TASKS``, ``rl_engine.algos.advantages.ADVANTAGES``,
``rl_engine.algos.losses.AGGREGATIONS`` and ``OFF_POLICY_WEIGHTS``); a test checks each list here holds
exactly the names its registry does, so adding one means adding it to both. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Names:
    """The names of one registry: ``what`` one of them is called in an error ("reward")."""

    what: str
    names: tuple[str, ...]

    def check(self, value: Any) -> Any:
        """``value`` when it is one of the names (or not a string: the field's type refuses that);
        else a ValueError that lists the names."""
        if isinstance(value, str) and value not in self.names:
            shown = value if len(value) <= 80 else f"{value[:80]}..."  # never echo a megabyte back
            raise ValueError(f"unknown {self.what} {shown!r}; choose one of {', '.join(sorted(self.names))}")
        return value


REWARDS = Names("reward", ("exact_match", "contains", "numeric_answer", "format", "math_verify"))
TASKS = Names("task", ("copy", "next_digit", "add_mod10", "reverse", "add"))
ADVANTAGES = Names("advantage estimator", ("grpo", "dr_grpo", "rloo", "reinforce_pp"))
LOSS_AGGREGATIONS = Names(
    "loss aggregation", ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
)
OFF_POLICY = Names("off-policy correction", ("none", "tis", "decoupled"))

# The advantage estimators whose baseline is the other responses of the prompt's group: they need
# ``rollout.n >= 2``.
WITHIN_GROUP = frozenset({"grpo", "dr_grpo", "rloo"})

REGISTRIES: tuple[Names, ...] = (REWARDS, TASKS, ADVANTAGES, LOSS_AGGREGATIONS, OFF_POLICY)

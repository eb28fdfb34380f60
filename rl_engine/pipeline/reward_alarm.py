"""The alert of a failing reward: when more than ``reward.unscored_alert_ratio`` of a step's samples is
unscored (a remote reward service could not score them: ``rl_engine.rewards.remote``), the driver sends
one ``alert`` event, and another only after a step at or below the threshold (one per episode)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RewardAlert:
    message: str
    data: dict[str, Any]


class UnscoredAlarm:
    """Watches each step's ``reward/unscored_ratio`` against ``threshold`` (``reward.unscored_alert_ratio``)."""

    def __init__(self, threshold: float, reward: str):
        self.threshold, self.reward = threshold, reward
        self.firing = False

    def check(self, step: int, ratio: float) -> RewardAlert | None:
        """The alert to send for ``step`` (its unscored share ``ratio``), or None."""
        if ratio <= self.threshold:
            self.firing = False
            return None
        if self.firing:
            return None
        self.firing = True
        return RewardAlert(
            f"reward {self.reward!r}: {ratio:.0%} of step {step}'s samples are unscored (over "
            f"reward.unscored_alert_ratio {self.threshold:g}): the reward could not be computed for them, "
            "so they are left out of the update; see reward/unscored and the engine log",
            {"step": step, "unscored_ratio": ratio, "threshold": self.threshold, "reward": self.reward},
        )

"""``answer_feedback``: a wrong answer gets a reply and another try.

The policy answers; the run's reward judges the answer (``Judge``: the configured reward applied to that
turn alone). At or above ``success_threshold`` the episode ends with that score; below it, the policy is
told so (``reply``) and tries again, up to ``attempts`` answers. The episode's reward is the last
attempt's score times ``discount ** (attempts taken - 1)``: a right answer on the second try is worth
``discount`` of one on the first. Any task with a verifiable answer works (the GSM8K-format set, the
reasoning-gym tasks).
"""

from __future__ import annotations

from rl_engine.envs.base import Environment, EnvStep, Episode, Judge

DEFAULT_REPLY = "That is not right. Try again, and give only the final answer."


class AnswerFeedback:
    def __init__(self, judge: Judge, attempts: int, discount: float, reply: str, success_threshold: float):
        self.judge, self.attempts, self.discount = judge, attempts, discount
        self.reply, self.success_threshold = reply, success_threshold

    def step(self, episode: Episode) -> EnvStep:
        score = self.judge(episode, episode.policy[-1])
        solved = score >= self.success_threshold
        if solved or episode.turn >= self.attempts:
            reward = score * self.discount ** (episode.turn - 1)
            return EnvStep(
                done=True, reward=reward, figures={"solved": float(solved), "attempts": float(episode.turn)}
            )
        return EnvStep(done=False, message=self.reply, role="user")


def answer_feedback(
    judge: Judge,
    attempts: int = 3,
    discount: float = 0.5,
    reply: str = DEFAULT_REPLY,
    success_threshold: float = 1.0,
) -> Environment:
    """A wrong answer gets a reply ("That is not right...") and another try, up to ``attempts``; the
    reward is the last try's score (the run's reward) times ``discount`` per extra try."""
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 16:
        raise ValueError(f"attempts must be an integer in 1..16, got {attempts!r}")
    if isinstance(discount, bool) or not isinstance(discount, int | float) or not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be a number in [0, 1], got {discount!r}")
    if not isinstance(reply, str) or not reply.strip() or len(reply) > 2000:
        raise ValueError("reply must be a non-empty text of at most 2000 characters")
    if isinstance(success_threshold, bool) or not isinstance(success_threshold, int | float):
        raise ValueError(f"success_threshold must be a number, got {success_threshold!r}")
    return AnswerFeedback(judge, attempts, float(discount), reply, float(success_threshold))

"""``calculator``: a tool the policy calls in the model's tool-call format (ChatML/Hermes), the result
coming back as a ``tool`` message.

A policy turn that holds ``<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}
</tool_call>`` is answered with the value (``84``), one line per call (at most ``max_calls_per_turn``);
a call that is not valid JSON, names another tool, lacks ``expression`` or holds something that is not
plain arithmetic is answered with an ``error: ...`` line and counted in ``tool_errors``. The expression
is evaluated by :mod:`rl_engine.envs.arithmetic` (parsed, never ``eval``-ed). A turn without a tool call
is the final answer: the episode ends, scored by the run's reward (the ``Judge``).

Figures (per episode, ``env/<name>``): ``tool_calls`` (calls written) and ``tool_errors`` (calls answered
with an error), over every policy turn, kept also when a budget cuts the episode.

The policy has to know the tool exists: :data:`SYSTEM_PROMPT` says so (``data.system_prompt``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rl_engine.envs.arithmetic import ExpressionError, evaluate, format_number
from rl_engine.envs.base import Environment, EnvStep, Episode, Judge

TOOL_NAME = "calculator"
SYSTEM_PROMPT = (
    "You can use a calculator. To use it, write\n"
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>\n'
    "and its result comes back in a tool message. Use + - * / // % ** and parentheses. "
    "When you know the answer, give only the final answer."
)
# A call's body runs to its closing tag, or to the end of the turn (a turn cut by its token budget).
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_BAD_ARGUMENTS = 'error: the arguments must be {"expression": "<arithmetic>"}'


@dataclass(frozen=True)
class ToolResult:
    text: str  # the line the tool answers
    error: bool


def tool_calls(text: str) -> list[str]:
    """The bodies of the ``<tool_call>`` blocks in a policy turn, in order."""
    return [m.group(1) for m in _TOOL_CALL.finditer(text)]


def run_call(body: str) -> ToolResult:
    """The calculator's answer to one call's body (JSON: ``name`` and ``arguments``)."""
    try:
        call: Any = json.loads(body.strip())
    except (ValueError, RecursionError):
        return ToolResult("error: the tool call is not valid JSON", True)
    if not isinstance(call, dict):
        return ToolResult('error: a tool call is a JSON object: {"name": ..., "arguments": ...}', True)
    name = call.get("name")
    if name != TOOL_NAME:
        shown = name[:40] if isinstance(name, str) else name if name is None else type(name).__name__
        return ToolResult(f"error: unknown tool {shown!r}; the tool is {TOOL_NAME!r}", True)
    arguments = call.get("arguments")
    if isinstance(arguments, str):  # OpenAI style: the arguments as a JSON text
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return ToolResult(_BAD_ARGUMENTS, True)
    if not isinstance(arguments, dict) or not isinstance(arguments.get("expression"), str):
        return ToolResult(_BAD_ARGUMENTS, True)
    try:
        return ToolResult(format_number(evaluate(arguments["expression"])), False)
    except ExpressionError as exc:
        return ToolResult(f"error: {exc}", True)


class Calculator:
    def __init__(self, judge: Judge, max_calls_per_turn: int):
        self.judge, self.max_calls_per_turn = judge, max_calls_per_turn

    def answer(self, turn: str) -> list[ToolResult]:
        """The results of a turn's calls: one per call run, then one error for those over the limit."""
        calls = tool_calls(turn)
        results = [run_call(body) for body in calls[: self.max_calls_per_turn]]
        extra = len(calls) - self.max_calls_per_turn
        if extra > 0:
            results.append(
                ToolResult(f"error: at most {self.max_calls_per_turn} calls per turn; {extra} not run", True)
            )
        return results

    def figures(self, turns: Sequence[str]) -> dict[str, float]:
        calls = errors = 0
        for turn in turns:
            n = len(tool_calls(turn))
            results = self.answer(turn)
            calls += n
            errors += sum(r.error for r in results[: self.max_calls_per_turn])
            errors += max(0, n - self.max_calls_per_turn)
        return {"tool_calls": float(calls), "tool_errors": float(errors)}

    def step(self, episode: Episode) -> EnvStep:
        last = episode.policy[-1]
        results = self.answer(last)
        figures = self.figures(episode.policy)
        if not results:  # no tool call: the final answer
            return EnvStep(done=True, reward=self.judge(episode, last), figures=figures)
        return EnvStep(done=False, message="\n".join(r.text for r in results), role="tool", figures=figures)


def calculator(judge: Judge, max_calls_per_turn: int = 4) -> Environment:
    """A calculator tool called in the ChatML/Hermes ``<tool_call>`` format, answered in a tool message;
    a turn without a call is the final answer, scored by the run's reward."""
    if (
        isinstance(max_calls_per_turn, bool)
        or not isinstance(max_calls_per_turn, int)
        or not 1 <= max_calls_per_turn <= 16
    ):
        raise ValueError(f"max_calls_per_turn must be an integer in 1..16, got {max_calls_per_turn!r}")
    return Calculator(judge, max_calls_per_turn)

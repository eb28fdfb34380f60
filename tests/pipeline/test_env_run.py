"""Multi-turn runs through the real pipeline (Ray actors, the HF worker and PolicyTrainer on the tiny
model): with the answer_feedback environment every step reports its episodes' figures and the held-out
evaluation plays episodes too; with the calculator every step reports its tool figures, and the examples
the run reports carry their episodes' turns as the platform's wire takes them; a TextArena game's
episodes end by its rules with its reward."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_engine import wire
from rl_engine.config import parse_config
from rl_engine.pipeline import run_experiment
from rl_engine.presets import get_preset
from tests.pipeline.conftest import RecordingSink

pytestmark = pytest.mark.timeout(300)


def test_a_multi_turn_run_reports_its_episodes(ray_session, tiny_dir: Path):
    data = get_preset("demo-cpu")
    data["model"] = {"path": str(tiny_dir)}
    data["rollout"].update({"n": 4, "max_new_tokens": 64})
    data["trainer"].update({"total_steps": 3, "batch_size": 16, "mini_batch_size": 16})
    data["pipeline"] = {"mode": "fully_async", "staleness_threshold": 1}
    data["env"] = {
        "name": "answer_feedback",
        "kwargs": {"attempts": 2, "discount": 0.5, "reply": "no"},
        "max_turn_tokens": 4,
    }
    data["data"]["num_validation_prompts"] = 4
    data["eval"] = {"at_end": True, "prompts_per_call": 4}
    data["logging"] = {"sinks": [], "log_every": 1}
    sink = RecordingSink()
    summary = run_experiment(parse_config(data), sink)
    assert summary.steps_done == 3
    steps = [m for _, m in sink.metrics if "reward/unscored_ratio" in m]
    assert len(steps) == 3
    for m in steps:
        assert 1.0 <= m["env/turns/mean"] <= 2.0 and m["env/errors/mean"] == 0.0
        assert 0.0 <= m["env/solved/mean"] <= 1.0 or m["env/truncated/mean"] > 0
    [val] = [m for _, m in sink.metrics if "val/num_prompts" in m]
    assert val["val/num_prompts"] == 4 and val["val/reward_errors"] == 0


def test_a_calculator_run_reports_its_tool_figures_and_its_episodes_turns(ray_session, tiny_dir: Path):
    data = get_preset("demo-cpu")
    data["model"] = {"path": str(tiny_dir)}
    data["rollout"].update({"n": 4, "max_new_tokens": 32})
    data["trainer"].update({"total_steps": 2, "batch_size": 8, "mini_batch_size": 8})
    data["env"] = {"name": "calculator", "max_turn_tokens": 8}
    data["logging"] = {"sinks": [], "log_every": 1, "samples_per_step": 2}
    sink = RecordingSink()
    summary = run_experiment(parse_config(data), sink)
    assert summary.steps_done == 2
    steps = [m for _, m in sink.metrics if "reward/unscored_ratio" in m]
    assert len(steps) == 2
    for m in steps:  # the tiny model writes no tool call: every episode is one final answer
        assert m["env/turns/mean"] == 1.0 and m["env/tool_calls/mean"] == 0.0
        assert m["env/tool_errors/mean"] == 0.0 and m["env/errors/mean"] == 0.0
    examples = [e for _, batch in sink.samples for e in batch]
    assert len(examples) == 4
    for example in examples:
        posted = wire.SampleIn.model_validate(wire.sample(example, 1))
        [turn] = posted.turns
        assert turn.role == "assistant" and 1 <= turn.tokens <= 8 and turn.logprob_mean < 0


@pytest.mark.slow  # a real run with Ray actors: ~22 s of which most is starting them, ~40 s with setup
def test_a_textarena_run_plays_its_games(ray_session, tmp_path: Path):
    """GuessTheNumber-v0 through the whole pipeline: the tiny model's guesses are mostly not numbers (an
    invalid move, then a lost game), sometimes numbers (a hint); either way the game ends its episodes
    with its own reward."""
    game = "GuessTheNumber-v0"
    data = get_preset("demo-cpu")
    # a longer context than the session's tiny model: a game's message is ~200 characters (tokens)
    data["model"] = {
        "path": str(tmp_path / "tiny"),
        "tiny": {**data["model"]["tiny"], "max_position_embeddings": 1024},
    }
    data["rollout"].update({"n": 4, "max_new_tokens": 720, "max_prompt_tokens": 64})
    data["trainer"].update({"total_steps": 2, "batch_size": 8, "mini_batch_size": 8})
    # the prompt's end ("... Enter your guess."): the tiny model could not read more anyway
    data["data"] = {"source": "textarena", "env_id": game, "train_size": 16}
    data["data"] |= {"overlong_prompts": "truncate", "truncation_side": "left"}
    data["env"] = {"name": "textarena", "kwargs": {"env_id": game}, "max_turns": 3, "max_turn_tokens": 3}
    data["logging"] = {"sinks": [], "log_every": 1, "samples_per_step": 2}
    sink = RecordingSink()
    summary = run_experiment(parse_config(data), sink)
    assert summary.steps_done == 2
    steps = [m for _, m in sink.metrics if "reward/unscored_ratio" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["env/errors/mean"] == 0.0 and 1.0 <= m["env/turns/mean"] <= 3.0
        assert 0.0 <= m["env/invalid_move/mean"] <= 1.0 and 0.0 <= m["env/game_reward/mean"] <= 1.0
    assert any(m["env/truncated/mean"] < 1.0 for m in steps)  # some games ended by the game's rules
    examples = [e for _, batch in sink.samples for e in batch]
    assert examples
    for example in examples:
        turns = wire.SampleIn.model_validate(wire.sample(example, 1)).turns
        assert [t.role for t in turns] == ["assistant", "user"] * (len(turns) // 2) + ["assistant"]
        assert all("[GAME]" in t.text for t in turns if t.role == "user")

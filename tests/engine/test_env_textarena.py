"""The ``textarena`` environment and ``data.source: textarena`` with the real TextArena package
(``textarena==0.7.4``): replay is the game played live, the same for a seed every time; a scripted
player (it stands in for the policy: a model that plays on purpose would need training) wins and loses
GuessTheNumber-v0 through ``EpisodeWorker`` with the tiny model's tokenizer, the episode's tokens being
the chat template's rendering of the conversation; bad settings are errors at their field."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import textarena as ta

from rl_engine.config import ConfigError, parse_config
from rl_engine.data import PromptStream
from rl_engine.data.stream import train_rows, validation_rows
from rl_engine.data.textarena_games import TEST, TRAIN, game_seed
from rl_engine.envs.episodes import META, REWARD, EpisodeWorker
from rl_engine.envs.registry import EpisodeReward, bound_environment
from rl_engine.envs.textarena_games import first_observation, replay
from rl_engine.types import Sample

GAME = "GuessTheNumber-v0"  # 1..20, 10 guesses


def live(seed: int, turns: list[str]) -> tuple[list[str], float | None, int]:
    """The reference: the game played as TextArena's own loop plays it (observe, act), its observations,
    its reward when over, its secret number."""
    game = ta.make(GAME)
    game.reset(num_players=1, seed=seed)
    seen = [game.get_observation()[1]]
    done = False
    for action in turns:
        done, _ = game.step(action)
        if done:
            break
        seen.append(game.get_observation()[1])
    reward = game.close()[0][0] if done else None
    return seen, reward, game.game_number


def test_replay_is_the_game_played_live_and_the_same_for_a_seed():
    target = live(11, [])[2]
    a, b, c = (n for n in (10, 15, 3, 4) if n != target)
    # the last two repeat a guess: an invalid move (the game allows one), then the game is lost
    # a move that writes a game message of its own: TextArena strips role tags from a move it echoes
    turns = [f"[{a}]", f"I say [{b}]\n[GAME] You won!", f"[{c}]", f"[{c}]", f"[{c}]"]
    before = random.getstate()
    for k in range(len(turns)):
        seen, reward, _ = live(11, turns[: k + 1])
        got = replay(GAME, 11, turns[: k + 1])
        assert got == replay(GAME, 11, turns[: k + 1])  # deterministic
        if reward is not None:
            assert k == len(turns) - 1 and got.done and got.reward == reward
            assert got.info["invalid_move"] and 0.0 < reward < 1.0
        else:  # the reply is what the live game's observation gained since the last move
            assert not got.done and got.observation in seen[-1] and got.observation.startswith("[GAME]")
            assert seen[-1].startswith(seen[-2]) and turns[k] not in got.observation
            assert "[Player]" not in got.observation and "won" not in got.observation
            if k < 3:
                assert got.observation in (
                    "[GAME] The target number is higher.",
                    "[GAME] The target number is lower.",
                )
    assert random.getstate() == before  # TextArena reseeds the global generator: put back
    assert first_observation(GAME, 11) == live(11, [])[0][0].strip()
    assert first_observation(GAME, 11) != first_observation("Mastermind-v0", 11)


class ScriptedWorker:
    """A rollout worker whose 'policy' is a function of the game's replies so far (a test double of the
    model; the episode machinery, the tokenizer and the game are real). Each turn ends with eos."""

    interrupted = False

    def __init__(self, tokenizer, play):
        self.tokenizer, self.play = tokenizer, play
        self.max_turn_tokens = None

    def _turn(self, s: Sample) -> Sample:
        replies = (s.metadata.get(META) or {}).get("replies", [])
        ids = self.tokenizer(self.play(replies), add_special_tokens=False)["input_ids"]
        ids = [*ids, self.tokenizer.eos_token_id]
        return replace(
            s,
            response_ids=s.response_ids + ids,
            logprobs=s.logprobs + [-1.0] * len(ids),
            finish_reason="stop",
        )

    def generate(self, prompts, n):
        out = []
        for p in prompts:
            for i in range(n):
                s = Sample(
                    prompt_uid=f"{p.uid}-{i}",
                    group_id=p.uid,
                    prompt_ids=list(p.token_ids),
                    response_ids=[],
                    logprobs=[],
                    finish_reason="stop",
                    param_version_start=0,
                    param_version_end=0,
                    prompt_text=p.text,
                    answer=p.answer,
                    metadata=dict(p.metadata),
                )
                out.append(self._turn(s))
        return out

    def resume(self, samples):
        return [self._turn(s) for s in samples]


def bisect(replies: list[str]) -> str:
    """Binary search on 1..20 from the game's hints (digits only: the tiny vocabulary has no '[', the
    game's action wrapper adds the brackets)."""
    low, high = 1, 20
    guess = 10
    for reply in replies:
        if "higher" in reply:
            low = guess + 1
        elif "lower" in reply:
            high = guess - 1
        guess = (low + high) // 2
    return str(guess)


def counting(replies: list[str]) -> str:
    return str(len(replies) + 1)  # 1, 2, 3, ...: every guess wrong when the number is above the last


def play(make_cfg, policy, rows: int = 4, max_turns: int = 12):
    cfg = make_cfg(
        f"data={{source: textarena, env_id: {GAME}, train_size: {rows}}}",
        f"env={{name: textarena, kwargs: {{env_id: {GAME}}}, max_turns: {max_turns}}}",
        "rollout.max_prompt_tokens=1024",
        "rollout.max_new_tokens=4096",
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    env = bound_environment(cfg.env.name, cfg.env.kwargs)
    worker = EpisodeWorker(ScriptedWorker(tok, policy), env, max_turns=max_turns, max_tokens=4096)
    prompts = PromptStream(cfg, tok).next_batch(rows)
    return tok, prompts, worker.generate(prompts, 1)


def conversation_ids(tok, s: Sample) -> list[int]:
    """The independent rendering: the chat template over the whole conversation, tokenized."""
    messages = [{"role": "user", "content": first_observation(GAME, s.metadata["textarena"]["seed"])}]
    state = s.metadata[META]
    for i, turn in enumerate(state["policy"]):
        messages.append({"role": "assistant", "content": turn})
        if i < len(state["replies"]):
            messages.append({"role": "user", "content": state["replies"][i]})
    text = tok.apply_chat_template(messages, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_a_scripted_player_wins_through_episodes_with_exact_tokens(make_cfg):
    tok, _, samples = play(make_cfg, bisect)
    for s in samples:
        target = live(s.metadata["textarena"]["seed"], [])[2]
        state = s.metadata[META]
        assert s.extra["env/done"] == 1.0 and s.extra["env/errors"] == 0.0 and s.extra["env/truncated"] == 0.0
        assert state["final"] == str(target) and 1 <= s.extra["env/turns"] <= 5  # log2(20) < 5
        assert s.extra[REWARD] == 1.0 and EpisodeReward(lambda _: 0.0)(s) == 1.0
        assert s.extra["env/invalid_move"] == 0.0
        assert s.prompt_ids + s.response_ids == conversation_ids(tok, s)
        for (start, end), reply in zip(state["spans"], state["replies"], strict=True):
            assert s.loss_mask[start:end] == [0] * (end - start)
            assert reply in ("[GAME] The target number is higher.", "[GAME] The target number is lower.")
        assert sum(s.loss_mask) == sum(len(tok(t)["input_ids"]) + 1 for t in state["policy"])


def test_a_scripted_player_loses_with_the_games_own_reward(make_cfg):
    tok, _, samples = play(make_cfg, counting, rows=8)
    lost = [s for s in samples if live(s.metadata["textarena"]["seed"], [])[2] > 11]
    assert lost  # 8 games: some number is above 11
    for s in lost:
        seed = s.metadata["textarena"]["seed"]
        target = live(seed, [])[2]
        _, reward, _ = live(seed, [str(n) for n in range(1, 21)])
        # TextArena checks its turn limit (10) before counting the turn: the game takes 11 guesses
        assert s.extra["env/turns"] == 11.0 and s.metadata[META]["final"] == "11"
        # its reward at the turn limit: how close the last guess was, 1 - |11 - n| / (20 - 1)
        assert s.extra[REWARD] == reward == pytest.approx(1 - (target - 11) / 19) and reward < 1.0
        assert s.prompt_ids + s.response_ids == conversation_ids(tok, s)


def test_the_data_source_starts_each_game_from_its_own_seed(make_cfg):
    cfg = make_cfg(
        f"data={{source: textarena, env_id: {GAME}, train_size: 50, test_size: 50, seed: 3}}",
        f"env={{name: textarena, kwargs: {{env_id: {GAME}}}}}",
    )
    train, held_out = train_rows(cfg), validation_rows(cfg)
    assert len(train) == 50 and len(held_out) == 50
    train_seeds = {train.row(j).metadata["textarena"]["seed"] for j in range(50)}
    test_seeds = {held_out.row(j).metadata["textarena"]["seed"] for j in range(50)}
    assert len(train_seeds) == len(test_seeds) == 50 and not train_seeds & test_seeds
    row = train.row(7)
    assert row.metadata["textarena"] == {"env_id": GAME, "seed": game_seed(3, TRAIN, 7)}
    assert row.prompt == first_observation(GAME, game_seed(3, TRAIN, 7)) and row.answer == ""
    assert held_out.row(7).metadata["textarena"]["seed"] == game_seed(3, TEST, 7)
    numbers = {live(s, [])[2] for s in train_seeds}
    assert len(numbers) > 5  # the seeds draw different games


GOOD = {
    "model": {"path": "m"},
    "data": {"source": "textarena", "env_id": GAME},
    "env": {"name": "textarena", "kwargs": {"env_id": GAME}},
}


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"env": {"name": "textarena"}}, "env.kwargs", "env_id"),
        (
            {"env": {"name": "textarena", "kwargs": {"env_id": "Nope-v0"}}},
            "env.kwargs",
            "not a TextArena game",
        ),
        ({"env": {"name": "textarena", "kwargs": {"env_id": "TicTacToe-v0"}}}, "env.kwargs", "single-player"),
        ({"env": {"name": "textarena", "kwargs": {"env_id": f"{GAME}-raw"}}}, "env.kwargs", "not text"),
        ({"env": {"name": "textarena", "kwargs": {"env_id": GAME, "seed": 1}}}, "env.kwargs", "seed"),
        ({"data": {"source": "textarena", "env_id": "Mastermind-v0"}}, "env.kwargs", "data.env_id"),
        ({"data": {"source": "textarena"}}, "data.env_id", "Field required"),
        ({"data": {"source": "task"}}, "env.name", "go together"),
        ({"env": {}}, "data.source", "go together"),
    ],
)
def test_bad_textarena_settings_name_the_field(change, field, words):
    with pytest.raises(ConfigError) as err:
        parse_config({**GOOD, **change})
    [(where, message)] = err.value.errors
    assert where == field and words in message, err.value.errors

"""``textarena``: a TextArena single-player game (https://github.com/LeonGuertler/TextArena), played
unchanged (docs/engine.md, "TextArena games").

TextArena games are stateful objects (``reset``, then ``get_observation`` / ``step(action)`` in turn,
``close`` for the rewards); our environments are stateless (``rl_engine.envs.base``). So each step
**replays**: the game is made from its id (``ta.make``, with the wrappers TextArena applies by default),
reset with the episode's seed (``Episode.metadata["textarena"]``, written by ``data.source: textarena``),
and given the policy's turns so far in order; its next observation is the reply, or, once the game is
over, its reward for the player is the episode's. A step costs ``turn`` game steps, an episode
O(turns^2): games are cheap (microseconds a step) and episodes a few turns.

TextArena seeds Python's global ``random`` in ``reset`` (and its games draw from it): games are played
one at a time in a process (a lock) and the global generator's state is put back afterwards, so replay is
deterministic and the rest of the process sees no change.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

from rl_engine.envs.base import Environment, EnvStep, Episode, Judge

META = "textarena"  # Episode.metadata[META] = {"env_id": ..., "seed": ...}
PACKAGE = "textarena==0.7.4"
_LOCK = threading.Lock()


class GameError(ValueError):
    """A game that cannot be played here (unknown id, several players, data it cannot find, ...)."""


@dataclass(frozen=True)
class Replay:
    """A game after the policy's turns: over (``reward``, ``info``) or waiting (``observation``: the
    text new since the last turn)."""

    done: bool
    observation: str = ""
    reward: float | None = None
    info: dict[str, Any] | None = None


def _textarena() -> Any:
    try:
        import textarena
    except ImportError:
        raise GameError(
            f"the textarena environment needs the TextArena package (pip install {PACKAGE})"
        ) from None
    return textarena


def _make(env_id: str, seed: int) -> Any:
    """The game ``env_id`` reset with ``seed`` (one player): GameError when it cannot be."""
    ta = _textarena()
    try:
        game = ta.make(env_id)
    except ValueError as exc:  # ta.make's answer to an id it does not register
        if "not found in registry" not in str(exc):
            raise GameError(f"{env_id} does not start: ValueError: {str(exc)[:200]}") from None
        raise GameError(
            f"env_id {env_id[:80]!r} is not a TextArena game (textarena {ta.__version__})"
        ) from None
    except Exception as exc:  # a game module that does not import (Chess-v0 on Python 3.11)
        raise GameError(f"{env_id} does not start: {_one_line(exc)}") from None
    try:
        game.reset(num_players=1, seed=seed)
    except AssertionError as exc:  # SinglePlayerState's check of num_players, and others'
        raise GameError(f"{env_id} is not a single-player game: {str(exc)[:200]}") from None
    except Exception as exc:  # a game that needs data it cannot fetch here (nltk corpora), ...
        raise GameError(f"{env_id} does not start: {_one_line(exc)}") from None
    return game


def _one_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if any(c.isalnum() for c in line)]
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


def _observation(game: Any) -> str:
    _player, text = game.get_observation()
    if not isinstance(text, str):
        raise GameError("the game's observation is not text: use a game id with TextArena's default wrappers")
    return text


def first_observation(env_id: str, seed: int) -> str:
    """The text the game shows its player before the first move (a prompt of ``data.source: textarena``)."""
    return replay(env_id, seed, ()).observation


def replay(env_id: str, seed: int, turns: tuple[str, ...] | list[str]) -> Replay:
    """The game ``env_id`` of ``seed`` after the player's ``turns``: deterministic (module docstring).
    ValueError when the game ended before the last turn (the episode is not this game's)."""
    with _LOCK:
        state = random.getstate()
        try:
            return _replay(env_id, seed, tuple(turns))
        finally:
            random.setstate(state)


def _replay(env_id: str, seed: int, turns: tuple[str, ...]) -> Replay:
    game = _make(env_id, seed)
    seen = _observation(game)
    if not turns:
        return Replay(done=False, observation=seen.strip())
    done = False
    for i, action in enumerate(turns):
        if i:
            seen = _observation(game)
        done, _ = game.step(action)
        if done and i < len(turns) - 1:
            raise ValueError(f"{env_id} seed {seed}: the game ended at turn {i + 1} of {len(turns)}")
    if done:
        rewards, info = game.close()
        return Replay(done=True, reward=float(rewards[0]), info=dict(info.get(0, {})))
    now = _observation(game)
    new = now[len(seen) :] if now.startswith(seen) else now
    return Replay(done=False, observation=_without_echo(new, game).strip())


def _without_echo(new: str, game: Any) -> str:
    """``new`` less TextArena's echo of the player's move at its head (``[Player] <move>``): the policy's
    turn is already in the conversation. The echo runs to the next message of the game or a player
    (``\n[GAME] ...``): TextArena removes every role tag (``[GAME]``, ``[Player]``) from a move before
    echoing it, so a move cannot end its echo early or forge a game message."""
    tags = [f"\n[{tag}]" for tag in game.state.role_mapping.values()]
    head = f"\n[{game.state.role_mapping.get(0, 'Player')}] "
    if not new.startswith(head):
        return new
    ends = [at for tag in tags if (at := new.find(tag, len(head))) >= 0]
    return new[min(ends) :] if ends else ""


class TextArenaGame:
    def __init__(self, env_id: str):
        self.env_id = env_id

    def step(self, episode: Episode) -> EnvStep:
        game = episode.metadata.get(META)
        if not isinstance(game, dict) or "seed" not in game:
            raise ValueError(
                "the episode's metadata has no textarena game (data.source: textarena writes it)"
            )
        if game.get("env_id") != self.env_id:
            raise ValueError(
                f"the episode is a game of {game.get('env_id')!r}, the environment plays {self.env_id!r}"
            )
        out = replay(self.env_id, int(game["seed"]), episode.policy)
        if not out.done:
            return EnvStep(done=False, message=out.observation or "(no message)", role="user")
        info = out.info or {}
        return EnvStep(
            done=True,
            reward=out.reward,
            figures={
                "invalid_move": float(bool(info.get("invalid_move"))),
                "game_reward": float(out.reward or 0.0),
            },
        )


def textarena(judge: Judge, env_id: str) -> Environment:
    """A TextArena single-player game (``env_id``, e.g. ``GuessTheNumber-v0``), replayed from the
    episode's seed each step; the episode's reward is the game's reward for its player."""
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"env_id must be a TextArena game id, e.g. 'GuessTheNumber-v0', got {env_id!r:.80}")
    try:
        first = first_observation(env_id, 0)
        if first != first_observation(env_id, 0):
            raise GameError(f"{env_id} is not deterministic for a seed: its replay would differ")
    except GameError as exc:
        raise ValueError(str(exc)) from None
    return TextArenaGame(env_id)

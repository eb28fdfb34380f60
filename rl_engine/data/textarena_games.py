"""Rows of ``data.source: textarena``: games of one TextArena single-player game, one seed each.

Row ``j`` of a split is the game ``data.env_id`` reset with seed ``2 * h + parity``, ``h`` a SHA-256 hash
of (``data.seed``, split, ``j``) below 2**62 and the parity 0 for the train split, 1 for the held-out one: no seed
of one split is a seed of the other (a game with few distinct starts, like GuessTheNumber-v0's 20
numbers, still repeats a start under another seed). The prompt is the game's first observation
(``rl_engine.envs.textarena_games.first_observation``, made when the row is read); the answer is empty
(the game scores the episode); the metadata carries the game id and seed that ``env.name: textarena``
replays.
"""

from __future__ import annotations

import hashlib

from rl_engine.config import TextArenaDataConfig
from rl_engine.data.rows import DataError, Row
from rl_engine.envs.textarena_games import META, GameError, first_observation

TRAIN, TEST = 0, 1  # the parity of a split's seeds


def game_seed(seed: int, split: int, j: int) -> int:
    """The seed of row ``j`` of ``split`` (``TRAIN`` or ``TEST``): even for train, odd for held-out."""
    digest = hashlib.sha256(f"{seed}:textarena:{split}:{j}".encode()).digest()
    return 2 * (int.from_bytes(digest[:8], "big") >> 2) + split


class TextArenaRows:
    """``size`` games of ``env_id``; a row's observation is made when it is read."""

    def __init__(self, data: TextArenaDataConfig, split: int, size: int):
        self.env_id, self.seed, self.split, self.size = data.env_id, data.seed, split, size

    def __len__(self) -> int:
        return self.size

    def row(self, j: int) -> Row:
        seed = game_seed(self.seed, self.split, j)
        try:
            prompt = first_observation(self.env_id, seed)
        except GameError as exc:
            raise DataError(str(exc)) from None
        return Row(answer="", prompt=prompt, metadata={META: {"env_id": self.env_id, "seed": seed}})


def train_split(data: TextArenaDataConfig) -> TextArenaRows:
    rows = TextArenaRows(data, TRAIN, data.train_size)
    rows.row(0)  # the game starts here (a clear error now, not at the first batch)
    return rows


def held_out_split(data: TextArenaDataConfig) -> TextArenaRows | None:
    """The held-out games (None when ``test_size`` is 0): seeds the train split never uses."""
    return TextArenaRows(data, TEST, data.test_size) if data.test_size else None

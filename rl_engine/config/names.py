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
from importlib import metadata
from typing import Any

from rl_engine.reward_plugins import PluginRefused, discover, refresh
from rl_engine.reward_plugins import plugin_package as plugin_package  # re-exported for the config's users


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


REWARDS = Names(
    "reward",
    ("exact_match", "contains", "numeric_answer", "format", "math_verify", "reasoning_gym", "http", "model"),
)
TASKS = Names("task", ("copy", "next_digit", "add_mod10", "reverse", "add"))
ADVANTAGES = Names("advantage estimator", ("grpo", "dr_grpo", "rloo", "reinforce_pp"))
LOSS_AGGREGATIONS = Names(
    "loss aggregation", ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
)
OFF_POLICY = Names("off-policy correction", ("none", "tis", "decoupled"))

# The procedural datasets of reasoning-gym (the pinned version in requirements.txt; ``data.source:
# reasoning_gym``): its registry ``reasoning_gym.factory.DATASETS`` less ``composite`` (the engine mixes
# datasets itself) and less those refused below. Kept here so the config names them without importing reasoning-gym (seconds, and
# matplotlib and sympy) in the web process; a test checks the list against the installed package.
_REASONING_GYM_NAMES = """
ab acre advanced_geometry aiw arc_1d arc_agi base_conversion basic_arithmetic bf binary_alternation
binary_matrix bitwise_arithmetic boxnet caesar_cipher calendar_arithmetic chain_sum circuit_logic
codeio coin_flip color_cube_rotation complex_arithmetic count_bits count_primes countdown
course_schedule cryptarithm decimal_arithmetic decimal_chain_sum dice emoji_mystery
family_relationships figlet_font fraction_simplification futoshiki game_of_life game_of_life_halting
gcd graph_color group_anagrams gsm_symbolic intermediate_integration isomorphic_strings jugs
kakurasu knight_swap knights_knaves largest_island lcm leg_counting letter_counting letter_jumble
list_functions mahjong_puzzle manipulate_matrix maze mini_sudoku modulo_grid n_queens
needle_haystack number_filtering number_format number_sequence number_sorting palindrome_generation
palindrome_partitioning path_star polynomial_equations polynomial_multiplication pool_matrix
power_function prime_factorization products propositional_logic puzzle24 quantum_lock ransom_note
rearc rectangle_count rotate_matrix rotten_oranges rubiks_cube rush_hour self_reference
sentence_reordering shortest_path simple_equations simple_geometry simple_integration sokoban
spell_backward spiral_matrix string_insertion string_manipulation string_splitting string_synthesis
sudoku survo syllogism time_intervals tower_of_hanoi tsumego word_ladder word_sequence_reversal
word_sorting zebra_puzzles
"""
# Datasets refused: their ``score_answer`` runs the response through Python's ``eval`` or sympy's
# ``parse_expr`` (itself an ``eval``), so a policy's output would run as code in the rollouter.
REASONING_GYM_REFUSED = frozenset(
    {
        "binary_matrix",
        "countdown",
        "intermediate_integration",
        "n_queens",
        "polynomial_multiplication",
        "puzzle24",
        "simple_integration",
        "spiral_matrix",
        "string_insertion",
    }
)
REASONING_GYM_DATASETS = Names(
    "reasoning-gym dataset",
    tuple(n for n in _REASONING_GYM_NAMES.split() if n not in REASONING_GYM_REFUSED),
)

# The advantage estimators whose baseline is the other responses of the prompt's group: they need
# ``rollout.n >= 2``.
WITHIN_GROUP = frozenset({"grpo", "dr_grpo", "rloo"})

# --- reward plugins ------------------------------------------------------------------------------------
# Installed packages add rewards under the entry-point group ``rl_engine.rewards`` (``rl_engine.reward_plugins``,
# docs/engine.md "Reward plugins"): found by their metadata only, nothing imported until a config that names
# one is checked. A plugin may not take a built-in's name.


def reward_plugins() -> dict[str, metadata.EntryPoint]:
    """The installed reward plugins by name (entry points, not loaded), those shadowing a built-in left
    out; cached for the process's life (``refresh_reward_plugins`` after installing one)."""
    return dict(discover(frozenset(REWARDS.names))[0])


def refused_reward_plugins() -> tuple[PluginRefused, ...]:
    """Installed entry points that are not offered, with the reason (a name that shadows a built-in)."""
    return discover(frozenset(REWARDS.names))[1]


def builtin_environments() -> tuple[str, ...]:
    """The built-in environments ``env.name`` accepts (``rl_engine.config.env.ENV_NAMES``)."""
    from rl_engine.config.env import ENV_NAMES

    return ENV_NAMES


def environment_plugins() -> dict[str, metadata.EntryPoint]:
    """The installed environment plugins by name (entry-point group ``rl_engine.envs``: entry points, not
    loaded), those shadowing a built-in left out: what ``env.name`` accepts besides the built-ins."""
    from rl_engine.envs.plugins import installed

    return installed(builtin_environments())


def refresh_reward_plugins() -> None:
    """Forget the cached entry points: the next lookup reads the installed packages again."""
    refresh()


def check_reward_name(value: Any) -> Any:
    """``value`` when it names a built-in reward or an installed plugin (or is not a string: the
    field's type refuses that); else a ValueError that lists both."""
    if not isinstance(value, str) or value in REWARDS.names:
        return value
    plugins = discover(frozenset(REWARDS.names))[0]
    if value in plugins:
        return value
    shown = value if len(value) <= 80 else f"{value[:80]}..."
    known = ", ".join(sorted(REWARDS.names))
    extra = f"; installed plugins: {', '.join(sorted(plugins))}" if plugins else ""
    raise ValueError(f"unknown reward {shown!r}; choose one of {known}{extra}")


REGISTRIES: tuple[Names, ...] = (REWARDS, TASKS, ADVANTAGES, LOSS_AGGREGATIONS, OFF_POLICY)

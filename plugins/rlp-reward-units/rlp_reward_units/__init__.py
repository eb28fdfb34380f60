"""An example reward plugin for rl_engine: ``unit_conversion`` (``rlp_reward_units.units``)."""

from rlp_reward_units.units import parse_quantity, unit_conversion

__all__ = ["parse_quantity", "unit_conversion"]

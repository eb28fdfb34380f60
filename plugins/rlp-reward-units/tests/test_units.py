"""The example plugin on its own: the scorer, its arguments, and its entry points as installed."""

from __future__ import annotations

from importlib import metadata
from types import SimpleNamespace

import pytest
from rlp_reward_units import parse_quantity, unit_conversion


def sample(response: str, answer: str) -> SimpleNamespace:
    return SimpleNamespace(response_text=response, answer=answer, prompt_text="", metadata={})


def test_quantities_are_read_in_their_base_unit():
    assert parse_quantity("it is 2.5km") == (2500.0, "length")
    assert parse_quantity("first 3 m, then 90 min") == (5400.0, "time")
    assert parse_quantity("42") == (42.0, None)
    assert parse_quantity("5 parsecs") is None
    assert parse_quantity("no number") is None


def test_a_converted_quantity_scores_with_its_figures():
    score = unit_conversion()
    assert score(sample("that makes 2500 m", "2.5 km")) == {"score": 1.0, "parsed": 1.0, "rel_error": 0.0}
    off = score(sample("2400 m", "2.5 km"))
    assert off["score"] == 0.0 and off["parsed"] == 1.0 and off["rel_error"] == pytest.approx(0.04)
    assert score(sample("2500 g", "2.5 km")) == {"score": 0.0, "parsed": 0.0}  # another kind
    assert score(sample("2500", "2.5 km")) == {"score": 0.0, "parsed": 0.0}  # no unit
    assert unit_conversion(require_unit=False)(sample("2500", "2500 m"))["score"] == 1.0
    assert unit_conversion(rel_tol=0.05)(sample("2400 m", "2.5 km"))["score"] == 1.0


def test_an_answer_without_a_quantity_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="holds no quantity"):
        unit_conversion()(sample("2 m", "two metres"))


@pytest.mark.parametrize("kwargs", [{"rel_tol": 2.0}, {"rel_tol": "x"}, {"require_unit": "yes"}])
def test_bad_arguments_are_refused_by_the_factory(kwargs):
    with pytest.raises(ValueError):
        unit_conversion(**kwargs)


def test_the_entry_points_are_installed():
    found = {ep.name: ep.value for ep in metadata.entry_points(group="rl_engine.rewards")}
    assert found["unit_conversion"] == "rlp_reward_units.units:unit_conversion"
    assert found["rlp_units_test_fixture"] == "rlp_reward_units.fixtures:misbehave"

"""The text forms of a sweep's distributions (``"uniform(a, b)"``) are read in one pass: a property test
against a brute-force reference parser written here, adversarial inputs of growing size (a regular
expression once spent seconds to hours of a web process on long runs of spaces), and a 10 kB hostile
value through ``POST /api/sweeps``, which must be a quick 400 naming the field."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sweeps import search_space as ss
from sweeps.models import Sweep
from tests.platform.conftest import client_for

NAMES = ("uniform", "loguniform", "int")


def reference_form(text: str) -> tuple[str, str, str] | None:
    """Brute force over every choice of the three delimiters: ``text`` is
    ``<ws><name><ws>(<ws><a><ws>,<ws><b><ws>)<ws>`` where a and b are non-empty and hold none of
    ``,()``, and ``<ws>`` is whitespace (``str.isspace``)."""
    found = []
    opens = [i for i, c in enumerate(text) if c == "("]
    commas = [i for i, c in enumerate(text) if c == ","]
    closes = [i for i, c in enumerate(text) if c == ")"]
    for i in opens:
        for j in commas:
            for k in closes:
                if not i < j < k:
                    continue
                head, a, b, tail = text[:i], text[i + 1 : j], text[j + 1 : k], text[k + 1 :]
                if any(c in part for part in (a, b) for c in ",()"):
                    continue
                if not all(c.isspace() for c in tail):
                    continue
                name = "".join(c for c in head if not c.isspace())
                if name not in NAMES or head.strip() != name:  # whitespace only around the name
                    continue
                if not a.strip() or not b.strip():
                    continue
                found.append((name, a.strip(), b.strip()))
    assert len(found) <= 1  # the delimiters of a match are the only ones: at most one way
    return found[0] if found else None


PIECES = st.sampled_from(
    ["uniform", "loguniform", "int", "uni", "(", ")", ",", " ", "  ", "\t", "\n", "\u00a0", "\u2003",
     "1", "0.5", "-2", "1e-6", "e", ".", "x", "inf", "nan"]
)  # fmt: skip
FORM_TEXT = st.lists(PIECES, max_size=14).map("".join)


@settings(max_examples=3000, deadline=None, derandomize=True)
@given(text=FORM_TEXT)
@example(text="uniform(0.1, 0.3)")
@example(text=" \tloguniform ( 1e-6 ,1e-4 ) \n")
@example(text="int(1,2)x")
@example(text="int((1,2)")
@example(text="uniform( , 1)")
@example(text="uniform(1, 2, 3)")
@example(text="uni form(1, 2)")
def test_the_text_form_parser_agrees_with_a_brute_force_reference(text):
    assert ss.parse_string_form(text) == reference_form(text)


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(text=FORM_TEXT)
def test_a_text_spec_is_the_distribution_its_reference_reading_names_or_a_value_error(text):
    form = reference_form(text)
    try:
        spec = ss.parse_spec(text)
    except ValueError:
        spec = None
    if form is None:
        assert spec is None
    elif spec is not None:
        name, low, high = form
        assert spec == ss.Distribution(name, float(low), float(high))  # type: ignore[arg-type]


def _adversarial(n: int) -> list[str]:
    """Shapes that made the old regular expression backtrack: long runs of whitespace between parts
    that almost match, with the closing parenthesis missing or followed by text."""
    pad = " " * n
    return [
        f"uniform({pad}1{pad}",
        f"uniform({pad}1{pad},{pad}2{pad}",
        f"uniform({pad}1{pad},{pad}2{pad})x",
        f"loguniform{pad}({pad}1{pad},{pad}",
        f"int({pad}1{pad}2{pad}3{pad})",
        "uniform(" + "1 " * n + ",",
        f"uniform(1,{pad}2)",  # well-formed: the reference reads it too
    ]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [10, 100, 1_000, 10_000, 100_000])
def test_adversarial_text_of_growing_size_is_read_like_the_reference(n):
    for text in _adversarial(n):
        assert ss.parse_string_form(text) == reference_form(text)


@pytest.mark.timeout(60)
def test_a_10_kb_adversarial_spec_through_the_api_is_a_400_naming_the_field(team, experiment):
    hostile = "uniform(" + " " * 5_000 + "1" + " " * 5_000
    body = {
        "experiment": experiment.pk,
        "metric": "reward/mean",
        "method": "random",
        "max_runs": 1,
        "search_space": {"trainer.lr": hostile, "algorithm.kl_coef": "uniform(0, " + " " * 9_990 + "1)"},
    }
    resp = client_for(team["member"]).post("/api/sweeps", body, format="json")
    assert resp.status_code == 400, resp.content
    errors = resp.json()["errors"]
    assert set(errors) == {"search_space.trainer.lr", "search_space.algorithm.kl_coef"}, errors
    assert "at most 200 characters" in errors["search_space.trainer.lr"][0]
    assert len(resp.content) < 2_000  # the message does not echo the 10 kB value
    assert not Sweep.objects.exists()


def test_a_uniform_range_wider_than_a_float_is_refused_at_its_field():
    with pytest.raises(ss.SearchSpaceError) as err:
        ss.parse_search_space({"algorithm.kl_coef": "uniform(-1e308, 1e308)"}, "random")
    assert err.value.errors[0][0] == "algorithm.kl_coef" and "wider" in err.value.errors[0][1]
    # An integer beyond the float range as a bound is a refusal too, not an OverflowError.
    with pytest.raises(ss.SearchSpaceError):
        ss.parse_search_space({"trainer.total_steps": {"int": [1, 10**400]}}, "random")


@pytest.mark.parametrize(
    "spec",
    [
        "uniform(0.1, 0.3)",
        " loguniform( 1e-6 , 1e-4 ) ",
        "int(1,   8)",
        "uniform(0.1000000000000000000000000000000000000000000000000000000000000000000000000000, 0.3)",
    ],
)
def test_the_text_limit_takes_exactly_max_spec_text_characters_and_refuses_one_more(spec):
    """MAX_SPEC_TEXT (200) counts the whole text, whitespace included: a spec of exactly 200 characters is
    read, one of 201 is refused saying so (an off-by-one either way lets one through or refuses one)."""
    assert ss.MAX_SPEC_TEXT == 200
    for pad_at in ("end", "start", "inside"):
        texts = {}
        for length in (ss.MAX_SPEC_TEXT - 1, ss.MAX_SPEC_TEXT, ss.MAX_SPEC_TEXT + 1):
            pad = " " * (length - len(spec))
            if pad_at == "end":
                text = spec + pad
            elif pad_at == "start":
                text = pad + spec
            else:
                text = spec.replace("(", "(" + pad, 1)
            assert len(text) == length
            texts[length] = text
        expected = ss.parse_spec(spec)
        assert ss.parse_spec(texts[199]) == expected
        assert ss.parse_spec(texts[200]) == expected
        with pytest.raises(ValueError, match="at most 200 characters") as err:
            ss.parse_spec(texts[201])
        assert "got 201" in str(err.value)
        # The same at the level of a whole search space: the field is named.
        assert ss.parse_search_space({"trainer.lr": texts[200]}, "random").fields["trainer.lr"] == expected
        with pytest.raises(ss.SearchSpaceError) as space_err:
            ss.parse_search_space({"trainer.lr": texts[201]}, "random")
        assert space_err.value.errors[0][0] == "trainer.lr"

"""experiments.config_diff: hand-built nested documents, then random ones against a brute-force reference
(flatten every document to its leaves on its own, compare the sets)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.config_diff import ABSENT, config_differences, dotted_path, same_value


def diff(configs: dict) -> dict[str, dict]:
    return {d.path: d.values for d in config_differences(configs)}


def test_a_changed_leaf_is_listed_with_every_documents_value_and_equal_ones_are_not():
    a = {"trainer": {"lr": 1e-6, "total_steps": 10}, "seed": 0}
    b = {"trainer": {"lr": 3e-6, "total_steps": 10}, "seed": 0}
    c = {"trainer": {"lr": 1e-6, "total_steps": 10}, "seed": 0}
    assert diff({1: a, 2: b, 3: c}) == {"trainer.lr": {1: 1e-6, 2: 3e-6, 3: 1e-6}}
    assert diff({1: a, 3: c}) == {}


def test_an_absent_field_is_not_a_null_one():
    got = config_differences({"x": {"a": {"b": None}}, "y": {"a": {}}, "z": {"a": {"b": None}}})
    # "y" has an empty mapping at "a": a leaf there (never lost), and "a.b" absent.
    assert [(d.path, d.values) for d in got] == [
        ("a", {"x": ABSENT, "y": {}, "z": ABSENT}),
        ("a.b", {"x": None, "y": ABSENT, "z": None}),
    ]
    assert got[1].absent == ["y"] and got[1].present() == {"x": None, "z": None}
    assert ABSENT is not None and repr(ABSENT) == "ABSENT"
    assert diff({1: {"k": None}, 2: {}}) == {"k": {1: None, 2: ABSENT}}
    assert diff({1: {"k": None}, 2: {"k": None}}) == {}


def test_a_list_is_one_value():
    a = {"logging": {"sinks": ["console", "jsonl"]}, "data": {"tasks": [{"name": "copy", "w": 1}]}}
    b = {"logging": {"sinks": ["console"]}, "data": {"tasks": [{"name": "copy", "w": 1}]}}
    assert diff({1: a, 2: b}) == {"logging.sinks": {1: ["console", "jsonl"], 2: ["console"]}}
    c = {"logging": {"sinks": ["console", "jsonl"]}, "data": {"tasks": [{"name": "copy", "w": 2}]}}
    assert diff({1: a, 3: c}) == {
        "data.tasks": {1: [{"name": "copy", "w": 1}], 3: [{"name": "copy", "w": 2}]}
    }


def test_a_mapping_against_a_leaf_lists_both_sides():
    a = {"rollout": {"backend": "hf", "n": 4}}
    b = {"rollout": "hf"}
    assert diff({1: a, 2: b}) == {
        "rollout": {1: ABSENT, 2: "hf"},
        "rollout.backend": {1: "hf", 2: ABSENT},
        "rollout.n": {1: 4, 2: ABSENT},
    }


def test_values_compare_as_json_values():
    assert diff({1: {"v": 1}, 2: {"v": 1.0}}) == {}
    assert diff({1: {"v": True}, 2: {"v": 1}}) == {"v": {1: True, 2: 1}}
    assert diff({1: {"v": 0}, 2: {"v": False}}) == {"v": {1: 0, 2: False}}
    assert diff({1: {"v": "1"}, 2: {"v": 1}}) == {"v": {1: "1", 2: 1}}
    assert diff({1: {"v": [1, True]}, 2: {"v": [1.0, 1]}}) == {"v": {1: [1, True], 2: [1.0, 1]}}
    assert diff({1: {"v": [{"a": 1}]}, 2: {"v": [{"a": 1.0}]}}) == {}
    assert same_value(ABSENT, ABSENT) and not same_value(ABSENT, None)


def test_sorted_by_path_key_by_key_and_unambiguous_paths():
    a = {"b": {"x": 1}, "a": {"z": 1, "y": 1}, "a.b": 1, "": {"q w": 1}}
    b = {"b": {"x": 2}, "a": {"z": 2, "y": 2}, "a.b": 2, "": {"q w": 2}}
    assert [d.path for d in config_differences({1: a, 2: b})] == [
        '[""]["q w"]',
        "a.y",
        "a.z",
        '["a.b"]',
        "b.x",
    ]
    assert dotted_path(("trainer", "lr")) == "trainer.lr"
    assert dotted_path(("data", "columns", "a.b")) == 'data.columns["a.b"]'


def test_one_document_or_none_has_no_differences():
    assert config_differences({}) == []
    assert config_differences({1: {"a": 1}}) == []
    assert diff({1: {}, 2: {}}) == {}
    assert diff({1: {}, 2: {"a": 1}}) == {"a": {1: ABSENT, 2: 1}}


# --- brute force ----------------------------------------------------------------------------------------


def flatten(doc: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every leaf of ``doc`` by its key path: non-mappings and empty mappings (the document itself is
    always descended into)."""
    out: dict[tuple[str, ...], Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = value
    return out


def canon(value: Any) -> Any:
    """A hashable form equal exactly when the JSON values are."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("num", float(value))
    if isinstance(value, list):
        return ("list", tuple(canon(v) for v in value))
    if isinstance(value, dict):
        return ("dict", frozenset((k, canon(v)) for k, v in value.items()))
    return (type(value).__name__, value)


def reference(configs: dict[int, dict]) -> dict[tuple[str, ...], dict[int, Any]]:
    flat = {k: flatten(doc) for k, doc in configs.items()}
    paths = set().union(*(f.keys() for f in flat.values())) if flat else set()
    out = {}
    for path in paths:
        values = {k: f.get(path, ABSENT) for k, f in flat.items()}
        forms = {("absent",) if v is ABSENT else canon(v) for v in values.values()}
        if len(forms) > 1:
            out[path] = values
    return out


KEYS = st.sampled_from(["a", "b", "c", "lr", "x.y"])
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([0.0, 1.0, 1e-6, 3e-6, -2.5]),
    st.sampled_from(["", "hf", "vllm"]),
    st.lists(st.integers(0, 1), max_size=2),
    st.just({}),
)
DOCS = st.recursive(LEAVES, lambda inner: st.dictionaries(KEYS, inner, max_size=4), max_leaves=12)
CONFIGS = st.dictionaries(st.integers(1, 30), st.dictionaries(KEYS, DOCS, max_size=4), max_size=5)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(CONFIGS)
def test_the_differences_are_the_brute_force_references(configs):
    got = config_differences(configs)
    keys = [d.keys for d in got]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert {d.keys: d.values for d in got} == (reference(configs) if len(configs) > 1 else {})
    for d in got:
        assert list(d.values) == list(configs)  # every document, in the order given


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.dictionaries(KEYS, DOCS, max_size=4), st.data())
def test_a_document_differs_from_its_copy_exactly_where_it_was_changed(doc, data):
    flat = flatten(doc)
    if not flat:
        return
    path = data.draw(st.sampled_from(sorted(flat)))
    changed = _set(doc, path, ["changed"])
    assert [d.keys for d in config_differences({1: doc, 2: changed})] == [path]
    assert config_differences({1: doc, 2: _set(doc, path, flat[path])}) == []


def _set(doc: dict, path: tuple[str, ...], value: Any) -> dict:
    head, *rest = path
    copy = dict(doc)
    copy[head] = _set(doc[head], tuple(rest), value) if rest else value
    return copy

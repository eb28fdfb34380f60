"""The live bus's envelope (tracking/bus.py): what one process writes, another reads back unchanged; anything
else is refused with a ValueError (the reader logs and drops it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracking.bus import Envelope
from tracking.coverage import Span

_spans = st.lists(st.tuples(*[st.integers(0, 2**62)] * 4).map(lambda t: Span(*t)), max_size=5).map(tuple)


@given(
    run_id=st.integers(1, 2**62),
    kind=st.sampled_from(["metrics", "event", "alert", "hello"]),
    text=st.text(),  # newlines and any unicode included
    seq=st.integers(0, 2**62),
    spans=_spans,
    origin=st.text(alphabet="0123456789abcdef", max_size=32),
)
def test_an_envelope_reads_back_as_it_was_written(run_id, kind, text, seq, spans, origin):
    envelope = Envelope(run_id=run_id, kind=kind, text=text, seq=seq, spans=spans, origin=origin)
    assert Envelope.decode(envelope.encode()) == envelope
    assert Envelope.decode(envelope.encode().encode("utf8")) == envelope


@pytest.mark.parametrize("raw", ["", "no header", '[1, "metrics"]\n{}', "not json\n{}", b"\xff\xfe\n{}"])
def test_a_malformed_envelope_is_a_value_error(raw):
    with pytest.raises(ValueError):
        Envelope.decode(raw)

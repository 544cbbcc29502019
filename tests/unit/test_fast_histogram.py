"""FastHistogram: cumulative buckets with Prometheus' ``le`` (<=) semantics."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamworks.runtime.metrics import FastHistogram


def test_a_value_on_a_bound_counts_in_that_bucket() -> None:
    h = FastHistogram((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 2.0, 3.0):
        h.observe(v)
    assert h.buckets() == [("1.0", 2.0), ("2.0", 4.0), ("+Inf", 5.0)]
    assert h.sum == 8.0 and h.count == 5


@given(st.lists(st.floats(min_value=0, max_value=100, allow_nan=False)))
def test_buckets_match_a_direct_count(values: list[float]) -> None:
    bounds = (0.1, 1.0, 10.0)
    h = FastHistogram(bounds)
    for v in values:
        h.observe(v)
    expected = [float(sum(v <= b for v in values)) for b in bounds] + [float(len(values))]
    assert [n for _, n in h.buckets()] == expected

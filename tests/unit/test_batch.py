"""Batch settings and the per-item outcome of a batch: nothing of an ordering lane is
acked past one of its items that failed, whatever the handler marks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamworks.batch import MAX_BATCH_SIZE, Batch, ItemOutcome, settle_batch
from streamworks.exceptions import ConfigurationError

ACK, FAILED, RELEASED = ItemOutcome.ACK, ItemOutcome.FAILED, ItemOutcome.RELEASED


def test_defaults_and_triggers() -> None:
    b = Batch(max_size=500, max_wait=timedelta(milliseconds=50))
    assert not b.full(499) and b.full(500)
    assert b.starts_at(10.0) == pytest.approx(10.05)
    assert Batch().max_size == 100


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"max_size": 0}, "max_size"),
        ({"max_size": MAX_BATCH_SIZE + 1}, "max_size"),
        ({"max_size": 1.5}, "max_size"),
        ({"max_size": True}, "max_size"),
        ({"max_wait": timedelta(seconds=-1)}, "max_wait"),
        ({"max_wait": timedelta(minutes=2)}, "max_wait"),
        ({"max_wait": 0.05}, "max_wait"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        Batch(**kwargs)  # type: ignore[arg-type]


def test_a_returned_batch_is_acked_whole() -> None:
    assert settle_batch(["a", "b", "a"]) == [ACK, ACK, ACK]


def test_a_raised_batch_fails_every_item() -> None:
    assert settle_batch(["a", "b", None], [1], batch_failed=True) == [FAILED] * 3


def test_a_failed_item_holds_back_its_lane_only() -> None:
    lanes = ["a", "b", "a", "a", "b", None, None]
    assert settle_batch(lanes, [2, 5]) == [ACK, ACK, FAILED, RELEASED, ACK, FAILED, ACK]


def test_items_marked_after_the_first_failure_count_as_failed() -> None:
    assert settle_batch(["a", "a", "a"], [0, 2]) == [FAILED, RELEASED, FAILED]


def test_a_failure_index_outside_the_batch_is_a_bug() -> None:
    with pytest.raises(IndexError):
        settle_batch(["a"], [1])


@settings(deadline=None)  # CPU-bound examples on a shared machine
@given(
    st.lists(st.sampled_from(["a", "b", "c", None]), max_size=40).flatmap(
        lambda lanes: st.tuples(
            st.just(lanes),
            st.sets(st.integers(0, max(0, len(lanes) - 1))) if lanes else st.just(set()),
        )
    )
)
def test_no_lane_is_acked_past_a_failure(case: tuple[list[str | None], set[int]]) -> None:
    lanes, failed = case
    out = settle_batch(lanes, failed)
    assert len(out) == len(lanes)
    assert {i for i, o in enumerate(out) if o is FAILED} == failed
    for i, (lane, outcome) in enumerate(zip(lanes, out, strict=True)):
        earlier = [o for j, o in enumerate(out[:i]) if lanes[j] == lane and lane is not None]
        if outcome is ACK:
            assert all(o is ACK for o in earlier)
        if outcome is RELEASED:
            assert lane is not None and FAILED in earlier

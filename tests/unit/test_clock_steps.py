"""Detecting a step of the Redis clock (issue 18, finding 6), with injected clocks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamworks.coordinator.core.clock_steps import ClockReading, ClockStepDetector

SETTLE = 10.0  # a lease TTL
RTT = 0.002  # seconds between sending TIME and reading its reply


def detector() -> ClockStepDetector:
    return ClockStepDetector(tolerance_ms=250, drift=0.01, settle_s=SETTLE)


def reading(redis_ms: int, local: float, rtt: float = RTT) -> ClockReading:
    return ClockReading(redis_ms, local, local + rtt)


def test_a_steady_clock_is_no_step_and_holds_nothing() -> None:
    d = detector()
    for i in range(100):
        assert d.observe(reading(1_000_000 + i * 500, 50.0 + i * 0.5)) is None
    assert d.steps == 0 and not d.holding(100.0)


@pytest.mark.parametrize("jump_ms", [5_000, -5_000, 600, -600])
def test_a_step_holds_for_the_settle_time_and_a_step_back_until_redis_caught_up(
    jump_ms: int,
) -> None:
    d = detector()
    assert d.observe(reading(1_000_000, 50.0)) is None
    assert d.observe(reading(1_001_000, 51.0)) is None
    step = d.observe(reading(1_002_000 + jump_ms, 52.0))
    assert step is not None and step.step_ms == pytest.approx(jump_ms, abs=10)
    assert d.steps == 1
    assert d.holding(52.1)
    assert d.holding(52.0 + SETTLE - 0.01)
    # The clock keeps its new course: no further step.
    assert d.observe(reading(1_002_000 + jump_ms + 5_000, 57.0)) is None
    after = 52.0 + SETTLE + 0.01
    if jump_ms > 0:
        assert not d.holding(after)
    else:
        # Redis time is still below what was read before the step: tokens made from
        # it could fall below earlier ones. Held until it passed that.
        assert d.holding(after, 1_001_000)
        assert not d.holding(after, 1_001_001)


def test_a_step_during_a_hold_extends_it() -> None:
    d = detector()
    d.observe(reading(1_000_000, 50.0))
    assert d.observe(reading(1_060_000, 51.0)) is not None
    assert d.observe(reading(1_121_000, 53.0)) is not None
    assert d.holding(53.0 + SETTLE - 0.01) and not d.holding(53.0 + SETTLE + 0.01)


def test_a_slow_round_trip_widens_the_bracket_and_is_no_step() -> None:
    """An event loop blocked for 3 s between sending TIME and reading its reply: Redis
    time may be anywhere in that bracket."""
    d = detector()
    d.observe(reading(1_000_000, 50.0))
    assert d.observe(ClockReading(1_000_100, 50.05, 53.2)) is None
    assert d.observe(ClockReading(1_003_150, 53.1, 53.2)) is None


def test_overlapping_readings_from_concurrent_requests_are_no_step() -> None:
    d = detector()
    d.observe(ClockReading(1_000_300, 50.0, 50.5))
    # Sent before the previous one's reply arrived; Redis ran it first.
    assert d.observe(ClockReading(1_000_100, 50.1, 50.6)) is None


@given(
    start_ms=st.integers(10**12, 2 * 10**12),
    gaps=st.lists(st.floats(0.0, 30.0), min_size=1, max_size=30),
    rtts=st.lists(st.floats(0.0, 2.0), min_size=31, max_size=31),
    rate=st.floats(0.995, 1.005),
)
@settings(max_examples=300, deadline=None)
def test_drift_within_the_allowance_never_counts_as_a_step(
    start_ms: int, gaps: list[float], rtts: list[float], rate: float
) -> None:
    d = detector()
    local = 100.0
    redis = float(start_ms)
    d.observe(ClockReading(int(redis), local, local + rtts[0]))
    for gap, rtt in zip(gaps, rtts[1:], strict=False):
        local += gap
        redis += gap * 1000 * rate
        # TIME ran somewhere within the round trip.
        d.observe(ClockReading(int(redis + rtt * 500 * rate), local, local + rtt))
    assert d.steps == 0


@given(jump_s=st.floats(0.5, 3600.0), backwards=st.booleans(), gap=st.floats(0.0, 60.0))
@settings(max_examples=200, deadline=None)
def test_a_step_beyond_the_allowance_is_always_seen(
    jump_s: float, backwards: bool, gap: float
) -> None:
    d = detector()
    d.observe(reading(10**12, 100.0))
    jump = -jump_s if backwards else jump_s
    moved = int(10**12 + gap * 1000 + jump * 1000)
    step = d.observe(reading(moved, 100.0 + gap))
    allowance = 0.25 + gap * 0.01 + 0.01
    if abs(jump) > allowance:
        assert step is not None and (step.step_ms < 0) == backwards
        assert d.holding(100.0 + gap)


def test_invalid_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="drift"):
        ClockStepDetector(tolerance_ms=1, drift=1.0, settle_s=1)

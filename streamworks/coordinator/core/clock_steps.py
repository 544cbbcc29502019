"""Telling a step of the Redis clock from its normal course.

Leases, revocation deadlines and quarantines are absolute Redis ``TIME`` milliseconds,
and every member counts its own lease on its own clock. A clock *rate* difference is
allowed for (``worker.lease_drift``); a *step* is not: when the Redis clock jumps
forward (an operator or a broken NTP sets it, or a failover promotes a node whose
clock is ahead) every lease looks older than it is, and the coordinator would expire
members, release quarantines and grant their shards while the members still run them.
When it jumps back, fence tokens made from Redis time (``tokens.py``) could fall below
ones issued before.

:class:`ClockStepDetector` compares how far Redis time moved between two readings
with how far the coordinator's own clock (one that counts suspend time) moved. Each
reading is bracketed: the local time just before the command that read ``TIME`` was
sent and just after its reply arrived, so a slow round trip or a blocked event loop
widens the bracket instead of looking like a step. A move of Redis time outside
``[local lower bound x (1 - drift) - tolerance, local upper bound x (1 + drift) +
tolerance]`` is a step.

A step starts a **hold**, during which the shell grants nothing and expires or frees
nothing (fail safe): it lasts ``settle`` seconds of local time (a lease TTL, after
which every lease renewed before the step has run out in real time), and, after a
backward step, until Redis time is past the highest time read before it. A step during
a hold extends it. Pure: times are passed in (local seconds, Redis milliseconds).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("ClockReading", "ClockStep", "ClockStepDetector")


@dataclass(frozen=True, slots=True)
class ClockReading:
    """One reading of Redis ``TIME``.

    Attributes:
        redis_ms: Redis server time (ms), without any test offset.
        local_before: local time (s) just before the command was sent.
        local_after: local time (s) just after its reply arrived.
    """

    redis_ms: int
    local_before: float
    local_after: float


@dataclass(frozen=True, slots=True)
class ClockStep:
    """A detected step: about how far Redis time jumped (ms, negative: backwards),
    and the reading that showed it."""

    step_ms: int
    reading: ClockReading


class ClockStepDetector:
    """Detects steps of Redis time and says when grants and expiries are held.

    Args:
        tolerance_ms: how far Redis time may move beyond what the local clock explains
            (with ``drift``) before it counts as a step.
        drift: clock-rate difference allowed for (ratio).
        settle_s: how long a hold lasts after the last step (local seconds).
    """

    def __init__(self, *, tolerance_ms: int, drift: float, settle_s: float) -> None:
        if tolerance_ms < 0 or not 0 <= drift < 1 or settle_s < 0:
            raise ValueError("tolerance_ms, drift and settle_s must be >= 0 (drift < 1)")
        self.tolerance_ms = tolerance_ms
        self.drift = drift
        self.settle_s = settle_s
        self.steps = 0
        self._last: ClockReading | None = None
        self._highest_ms = 0  # the highest Redis time read so far
        self._hold_local: float | None = None  # hold until this local time...
        self._hold_redis = 0  # ...and until Redis time reaches this

    def observe(self, reading: ClockReading) -> ClockStep | None:
        """Take a reading; returns the step it shows, if any."""
        last, self._last = self._last, reading
        step = None if last is None else self._step(last, reading)
        if step is not None:
            self.steps += 1
            self._hold_local = reading.local_after + self.settle_s
            if step.step_ms < 0:
                # Hold until Redis time is past everything read before the step: a
                # token or revision made from it then exceeds every earlier one.
                self._hold_redis = max(self._hold_redis, self._highest_ms + 1)
        self._highest_ms = max(self._highest_ms, reading.redis_ms)
        return step

    def _step(self, last: ClockReading, now: ClockReading) -> ClockStep | None:
        moved = now.redis_ms - last.redis_ms
        # Between the two TIME executions the local clock moved at least this much
        # (negative when the requests overlapped) and at most that much.
        low = (now.local_before - last.local_after) * 1000
        high = (now.local_after - last.local_before) * 1000
        least = low * (1 - self.drift) if low >= 0 else low * (1 + self.drift)
        most = high * (1 + self.drift)
        if least - self.tolerance_ms <= moved <= most + self.tolerance_ms:
            return None
        expected = (least + most) / 2
        return ClockStep(round(moved - expected), now)

    def holding(self, local_now: float, redis_now_ms: int | None = None) -> bool:
        """Whether grants and expiries are held at local time ``local_now`` (and Redis
        time ``redis_now_ms``, the latest read when omitted)."""
        if self._hold_local is None:
            return False
        redis_now = self._highest_ms if redis_now_ms is None else redis_now_ms
        if local_now < self._hold_local or redis_now < self._hold_redis:
            return True
        self._hold_local = None  # settled
        return False

"""The local deadlines of one assignment lease (docs/guarantees.md#exclusive-processing).

After a successful heartbeat *sent* at ``sent`` (the member's monotonic clock), the
coordinator expires the member no earlier than ``leaseTtl`` after it *received* that
heartbeat, which is after ``sent``. The member's clock may run slower than the
coordinator's (Redis server time) by up to ``lease_drift`` (a rate, e.g. 1 %), so the
earliest expiry the member can be sure of, on its own clock, is::

    expires_at = sent + ttl * (1 - drift)            # ttl' = ttl * (1 - drift)

Every handler run must have ended before then. Counting back from ``expires_at``
with ``margin`` (one heartbeat interval) and ``grace`` (``worker.lease_grace``)::

    start_until  = expires_at - margin - grace   # no new run starts from here on
    cancel_at    = expires_at - margin           # running async handlers are cancelled
    fail_stop_at = expires_at - margin / 2       # a run still going: the process exits

A run that cannot be stopped (a plain ``def`` handler in its thread, an async handler
that swallows cancellation) and is still going at ``fail_stop_at`` makes the worker
process exit (``ownership.FAIL_STOP_EXIT_CODE``), which ends the run before the
coordinator can hand its shard to someone else.

With the defaults (``lease_ttl`` 10 s, ``heartbeat_interval`` 1 s, ``lease_grace``
5 s, ``lease_drift`` 1 %): ``expires_at`` = sent + 9.9 s, start until sent + 3.9 s,
cancel at sent + 8.9 s, fail-stop at sent + 9.4 s.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamworks.settings import Settings

__all__ = ("DEFAULT_GRACE", "Deadlines", "effective_grace", "lease_misfit")

#: ``worker.lease_grace`` when not set, if it fits the lease (else half the room).
DEFAULT_GRACE = 5.0

log = logging.getLogger("streamworks.worker")


@dataclass(frozen=True, slots=True)
class Deadlines:
    """The deadlines of one lease on the member's monotonic clock (see the module doc).

    Attributes:
        start_until: no handler run starts at or after this time.
        cancel_at: running async handlers are cancelled at this time.
        fail_stop_at: a run still going at this time makes the process exit.
        expires_at: the earliest time the coordinator may expire the member.
    """

    start_until: float
    cancel_at: float
    fail_stop_at: float
    expires_at: float

    @classmethod
    def after_heartbeat(
        cls, sent: float, ttl: float, *, margin: float, grace: float | None, drift: float
    ) -> Deadlines:
        """The deadlines of a lease of ``ttl`` seconds renewed by a heartbeat sent at
        ``sent``; ``grace`` is cut down if it does not fit (see :func:`effective_grace`)."""
        expires_at = sent + ttl * (1.0 - drift)
        cancel_at = expires_at - margin
        grace = effective_grace(ttl, margin=margin, grace=grace, drift=drift)
        return cls(
            start_until=cancel_at - grace,
            cancel_at=cancel_at,
            fail_stop_at=expires_at - margin / 2,
            expires_at=expires_at,
        )

    @classmethod
    def fixed(cls, deadline: float, grace: float | None) -> Deadlines:
        """A lease set by hand (a static assignment, a test): start work until
        ``deadline``, cancel ``grace`` later; no coordinator expiry, so no fail-stop."""
        return cls(
            start_until=deadline,
            cancel_at=deadline + (DEFAULT_GRACE if grace is None else grace),
            fail_stop_at=math.inf,
            expires_at=math.inf,
        )

    def ended(self, now: float) -> Deadlines:
        """These deadlines after the lease was taken away at ``now`` (fenced, unknown
        member): nothing starts, running async handlers are cancelled at once, and
        the fail-stop point stays the old lease's: the coordinator may hand the shards
        on at ``expires_at`` whatever it answered."""
        return Deadlines(
            start_until=min(self.start_until, now),
            cancel_at=min(self.cancel_at, now),
            fail_stop_at=self.fail_stop_at,
            expires_at=self.expires_at,
        )


_warned: set[tuple[float, float, float, float]] = set()


def effective_grace(ttl: float, *, margin: float, grace: float | None, drift: float) -> float:
    """``grace`` (None: :data:`DEFAULT_GRACE`), or half of what is left of the lease
    after the margin when it does not fit in it; a set grace cut down that way (the
    coordinator's lease is shorter than this worker's settings expect) is logged once
    per combination."""
    room = ttl * (1.0 - drift) - margin
    wanted = DEFAULT_GRACE if grace is None else grace
    if wanted < room:
        return wanted
    fitted = max(0.0, room / 2)
    if grace is None:
        return fitted
    key = (ttl, margin, grace, drift)
    if key not in _warned:
        _warned.add(key)
        log.warning(
            "lease_grace %.3gs does not fit a %.3gs lease with a %.3gs margin: using %.3gs",
            grace,
            ttl,
            margin,
            fitted,
        )
    return fitted


def lease_misfit(settings: Settings) -> str | None:
    """Why a worker with ``settings`` could not keep every run inside its lease, or
    None: a set ``worker.lease_grace`` plus the margin (one heartbeat interval) must
    be below ``lease_ttl * (1 - worker.lease_drift)`` (an unset one adapts)."""
    grace = settings.worker.lease_grace
    room = settings.lease_ttl * (1.0 - settings.worker.lease_drift)
    if settings.heartbeat_interval >= room:
        return (
            f"heartbeat_interval ({settings.heartbeat_interval:g}s) must be below lease_ttl x "
            f"(1 - worker.lease_drift) ({room:g}s)"
        )
    if grace is None or grace + settings.heartbeat_interval < room:
        return None
    return (
        f"worker.lease_grace ({grace:g}s) + heartbeat_interval "
        f"({settings.heartbeat_interval:g}s) must be below lease_ttl x (1 - "
        f"worker.lease_drift) ({room:g}s): handlers could outlive the lease"
    )

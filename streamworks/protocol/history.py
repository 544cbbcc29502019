"""The seam through which a run's protocol steps reach a history recorder.

The trace check (``tests/chaos/trace_check.py``, ``docs/protocol-model.md``) replays a
real run's steps against the invariants of the model of the protocol. The library
emits those steps here; what records them is a shell's choice:
:class:`streamworks.testing.history.HistoryRecorder` (a JSON-lines file), installed by
the CLI when ``STREAMWORKS_HISTORY_FILE`` is set, or by a test with :func:`install`.

Nothing is recorded unless a sink is installed: every function here returns after
one ``is None`` check of a module global, so the hooks stay in the production code
paths at no measurable cost (they run once per heartbeat, read batch, ack flush or
commit, never per message unless a sink is installed). The library layers may not
import ``streamworks.testing`` (``.importlinter``), hence this small protocol of
their own.

Times are on :func:`streamworks.clock.boottime` (the clock of ``Clock.monotonic``
with no offset, one per host), so the steps of every process of a host merge by
time. ``at`` is when a step happened when that is not the moment it is recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from streamworks.clock import boottime

__all__ = ("HistorySink", "install", "now", "sink", "token_of")


class HistorySink(Protocol):
    """What records protocol steps (the fields are those of ``testing/history.py``)."""

    def heartbeat(
        self,
        *,
        group: str,
        member: str,
        status: str,
        member_epoch: int,
        group_epoch: int,
        assigned: Mapping[str, int],
        revoke: Iterable[str] = (),
        lease_until: float | None = None,
        seq: int | None = None,
        at: float | None = None,
    ) -> None: ...

    def release(
        self,
        *,
        group: str,
        member: str,
        shard: str,
        token: int,
        reason: str,
        at: float | None = None,
    ) -> None: ...

    def commit(
        self,
        *,
        revision: int | str,
        replica: str = "",
        group: str = "",
        stream: str = "",
        at: float | None = None,
    ) -> None: ...

    def fence(
        self,
        *,
        group: str,
        shard: str,
        token: int,
        member: str,
        written: bool,
        at: float | None = None,
    ) -> None: ...

    def read(
        self,
        *,
        group: str,
        member: str,
        shard: str,
        token: int,
        entries: int,
        at: float | None = None,
    ) -> None: ...

    def ack(
        self,
        *,
        group: str,
        member: str,
        shard: str,
        token: int,
        entry: str,
        at: float | None = None,
    ) -> None: ...

    def migration(
        self, *, stream: str, phase: str, shards: Iterable[str] = (), at: float | None = None
    ) -> None: ...


#: The process's sink; None (the default): nothing is recorded.
sink: HistorySink | None = None


def install(new: HistorySink | None) -> HistorySink | None:
    """Make ``new`` the process's sink (None: record nothing); returns the previous one."""
    global sink
    previous, sink = sink, new
    return previous


def now() -> float | None:
    """The time to pass as ``at`` for a step timed before it is recorded (None, and no
    clock read, when nothing records)."""
    return None if sink is None else boottime()


def token_of(grant: str) -> int:
    """The fencing token of a grant or fence value ``"<token>:<member>"``."""
    return int(grant.partition(":")[0])

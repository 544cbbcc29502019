"""A history of protocol steps, recorded as JSON lines for the trace check.

A run (the chaos harness, a resharding soak, a test) can record the steps of the
protocol that matter for exclusive ownership, one JSON object per line, and
``python -m tests.chaos.trace_check FILE...`` then checks on that history the
invariants the Quint model of the protocol checks on its own runs
(``docs/protocol-model.md``): at most one member holds a valid grant of a shard at any
time, reads happen only under the currently valid grant, and a shard's fencing token
never decreases.

Every line has ``t`` (seconds on the run's monotonic clock: one host's
``CLOCK_BOOTTIME`` through :class:`~streamworks.clock.Clock`, so lines written by
several processes of one host can be merged by time), ``w`` when the step was timed
before it was written (``at``: then ``w`` is when it was written), ``kind``, and the
fields of its kind:

=============  ==========================================================================
kind           fields
=============  ==========================================================================
``heartbeat``  a member applied an answer: ``group``, ``member``, ``seq`` (the request's
               sequence number, or null), ``member_epoch``, ``group_epoch``, ``status``
               (``OK``, ``SYNC_METADATA``, ``FENCED``, ``UNKNOWN_MEMBER``), ``assigned``
               (shard -> fencing token: every shard it may read now), ``revoke`` (shards
               to drain), ``lease_until`` (when its lease ends, same clock as ``t``, or
               null when the answer renewed nothing)
``release``    a member stopped holding a shard (drain reported, dropped, lease lost):
               ``group``, ``member``, ``shard``, ``token``, ``reason``
``commit``     a coordinator committed group or stream metadata: ``group`` or
               ``stream``, ``revision``, ``replica``
``fence``      a coordinator wrote (or was refused) an owner fence: ``group``,
               ``shard``, ``token``, ``member``, ``written``
``read``       a member's fenced read (or takeover claim) took entries: ``group``,
               ``member``, ``shard``, ``token``, ``entries``
``ack``        a member acknowledged (or dead-lettered) an entry: ``group``, ``member``,
               ``shard``, ``token``, ``entry``
``migration``  a stream's migration changed phase: ``stream``, ``phase``, ``shards``
=============  ==========================================================================

Tokens are integers (a token wider than 63 bits is written as a decimal string so
every JSON reader keeps it exact). Every method takes an optional ``at``: the time the
step happened, when that is not the moment it is recorded (a read is timed when it was
sent: a process paused between the reply and the record must not move it past its
lease). A disabled recorder (:meth:`HistoryRecorder.disabled`)
returns from every method after one attribute check, so the hooks may stay in
production code paths.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

import orjson

from streamworks.clock import Clock
from streamworks.protocol import history

__all__ = ("ENV", "HistoryRecorder", "install_from_environment")

#: The variable naming a history file every ``streamworks worker`` and ``streamworks
#: coordinator`` process appends its steps to (``cli/common.py``: ``record_history``).
ENV = "STREAMWORKS_HISTORY_FILE"

#: Tokens beyond this are written as strings (orjson and many readers stop at 64 bits).
_EXACT_INT = 2**63 - 1


def _token(token: int) -> int | str:
    return token if -_EXACT_INT <= token <= _EXACT_INT else str(token)


class HistoryRecorder:
    """Appends protocol steps to a JSON-lines file.

    Each step is one ``write`` of one whole line on a file opened with ``O_APPEND``,
    so the recorders of several processes can share one file and a process killed
    mid-run leaves no torn line behind.

    Args:
        path: the history file (created if missing, appended to), or None for a
            recorder that records nothing.
        clock: the clock ``t`` is read from (the run's; defaults to a fresh
            :class:`~streamworks.clock.Clock`).
    """

    __slots__ = ("_clock", "_fd", "enabled", "path")

    def __init__(self, path: str | os.PathLike[str] | None, *, clock: Clock | None = None) -> None:
        self.path = None if path is None else os.fspath(path)
        self._clock = clock or Clock()
        self._fd: int | None = None
        if self.path is not None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        #: Whether steps are recorded; checked first by every method.
        self.enabled = self._fd is not None

    @classmethod
    def disabled(cls) -> HistoryRecorder:
        """A recorder that records nothing (the default where no history is wanted)."""
        return cls(None)

    def close(self) -> None:
        """Close the file; later steps are not recorded."""
        self.enabled = False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> HistoryRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the steps ------------------------------------------------------------------

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
    ) -> None:
        """A member applied a heartbeat answer."""
        if not self.enabled:
            return
        self._write(
            "heartbeat",
            at,
            group=group,
            member=member,
            seq=seq,
            status=status,
            member_epoch=member_epoch,
            group_epoch=group_epoch,
            assigned={shard: _token(token) for shard, token in sorted(assigned.items())},
            revoke=sorted(revoke),
            lease_until=lease_until,
        )

    def release(
        self,
        *,
        group: str,
        member: str,
        shard: str,
        token: int,
        reason: str,
        at: float | None = None,
    ) -> None:
        """A member no longer holds ``shard`` (no run of it is left)."""
        if not self.enabled:
            return
        self._write(
            "release",
            at,
            group=group,
            member=member,
            shard=shard,
            token=_token(token),
            reason=reason,
        )

    def commit(
        self,
        *,
        revision: int | str,
        replica: str = "",
        group: str = "",
        stream: str = "",
        at: float | None = None,
    ) -> None:
        """A coordinator's compare-and-set commit of group or stream metadata succeeded."""
        if not self.enabled:
            return
        self._write(
            "commit", at, group=group, stream=stream, revision=str(revision), replica=replica
        )

    def fence(
        self,
        *,
        group: str,
        shard: str,
        token: int,
        member: str,
        written: bool,
        at: float | None = None,
    ) -> None:
        """An owner-fence write was answered (``written``: not refused)."""
        if not self.enabled:
            return
        self._write(
            "fence",
            at,
            group=group,
            shard=shard,
            token=_token(token),
            member=member,
            written=written,
        )

    def read(
        self,
        *,
        group: str,
        member: str,
        shard: str,
        token: int,
        entries: int,
        at: float | None = None,
    ) -> None:
        """A fenced read or a takeover claim took ``entries`` entries (``at``: when it was
        sent, the moment the member decided to read under its lease)."""
        if not self.enabled:
            return
        self._write(
            "read",
            at,
            group=group,
            member=member,
            shard=shard,
            token=_token(token),
            entries=entries,
        )

    def ack(
        self,
        *,
        group: str,
        member: str,
        shard: str,
        token: int,
        entry: str,
        at: float | None = None,
    ) -> None:
        """An entry read under ``token`` was settled: acknowledged, or dead-lettered and
        acknowledged (``at``: when its run ended and the lease was checked)."""
        if not self.enabled:
            return
        self._write(
            "ack", at, group=group, member=member, shard=shard, token=_token(token), entry=entry
        )

    def migration(
        self, *, stream: str, phase: str, shards: Iterable[str] = (), at: float | None = None
    ) -> None:
        """A stream's migration moved to ``phase`` (FENCING, DRAINING, NONE)."""
        if not self.enabled:
            return
        self._write("migration", at, stream=stream, phase=phase, shards=sorted(shards))

    def _write(self, kind: str, at: float | None, **fields: Any) -> None:
        fd = self._fd
        if fd is None:
            return
        now = self._clock.monotonic()
        # ``w``: when a step timed earlier (``at``) was written; a process's lines
        # are in ``w`` order (one event loop writes them), not necessarily in ``t``.
        record = {"t": now, "kind": kind} if at is None else {"t": at, "w": now, "kind": kind}
        line = orjson.dumps({**record, **fields})
        os.write(fd, line + b"\n")


def install_from_environment() -> HistoryRecorder | None:
    """Record this process's protocol steps into the file :data:`ENV` names, if set
    (``{pid}`` in it: this process's id): the recorder becomes the process's sink
    (``streamworks.protocol.history``)."""
    path = os.environ.get(ENV)
    if not path:
        return None
    # One file per process (``{pid}``) keeps each file in write order (``w``).
    recorder = HistoryRecorder(path.replace("{pid}", str(os.getpid())))
    history.install(recorder)
    return recorder

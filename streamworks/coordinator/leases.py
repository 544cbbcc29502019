"""Member leases (``group:<g>:leases``: member -> expiry, Redis time ms) and the
revisions the lease script checks. A part of :class:`~streamworks.coordinator.store.Store`.

A revision is the pair of a metadata hash's ``rev`` and ``cid`` packed in one ``int``
(``rev << 128 | cid``; see ``store.py``), so callers keep comparing and caching plain
ints; the scripts compare it as ``"<rev>:<cid>"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from streamworks.clock import Clock, boottime
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import ScriptCall, Scripts
from streamworks.redis.wire import call

__all__ = (
    "MOVED",
    "RENEWED",
    "STALE",
    "LeaseOps",
    "revision_of",
    "revision_token",
    "split_revision",
)

#: ``lease_renew.lua``'s answers: renewed; not renewed (a revision moved or the lease
#: entry is gone: take the full road); the request is stale (nothing written).
RENEWED, MOVED, STALE = 1, 0, -1

_CID_BITS = 128


def revision_of(raw_rev: Any, raw_cid: Any) -> int:
    """The revision of a hash from its ``rev`` and ``cid`` fields (0: no hash)."""
    rev = int(raw_rev or 0)
    return (rev << _CID_BITS) | int(raw_cid or 0) if rev else 0


def split_revision(revision: int) -> tuple[int, int]:
    """``(rev, cid)`` of a revision."""
    return revision >> _CID_BITS, revision & ((1 << _CID_BITS) - 1)


def revision_token(revision: int) -> str:
    """A revision as the scripts compare it: ``"<rev>:<cid>"``."""
    rev, cid = split_revision(revision)
    return f"{rev}:{cid}"


class LeaseOps:
    """The lease operations of the store (``redis``, ``keyspace``, ``scripts``,
    ``time_offset_ms`` and the waited runs are the store's own)."""

    redis: Any
    keyspace: Keyspace
    scripts: Scripts
    clock: Clock

    @property
    def time_offset_ms(self) -> int:
        raise NotImplementedError

    async def run_waited(self, name: str, keys: list[Any], args: list[Any], what: str) -> Any:
        raise NotImplementedError

    def saw_script_time(self, redis_ms: int, before: float) -> None:
        raise NotImplementedError

    async def run_waited_many(self, calls: Sequence[ScriptCall], what: str) -> list[Any]:
        raise NotImplementedError

    async def renew_lease(
        self,
        group_id: str,
        member_id: str,
        ttl_ms: int,
        group_rev: int,
        stream_revs: Mapping[str, int],
        sequence: int | None = None,
    ) -> tuple[int, int]:
        """The no-change heartbeat (``lease_renew.lua``): ``(RENEWED | MOVED | STALE,
        redis now ms)``; the request's ``sequence`` is recorded with the renewal."""
        # The clock offset the script's time gets (a test may advance the clock while
        # the call is out: the reading must lose exactly what the script added).
        offset = self.clock.offset_ms
        keys, args = self._renewal(group_id, member_id, ttl_ms, group_rev, stream_revs, sequence)
        before = boottime()
        reply = await self.run_waited("lease_renew", keys, args, "renewing a lease")
        self.saw_script_time(int(reply[1]) - offset, before)
        return int(reply[0]), int(reply[1])

    async def renew_leases(
        self,
        group_id: str,
        renewals: Sequence[tuple[str, int | None]],
        ttl_ms: int,
        group_rev: int,
        stream_revs: Mapping[str, int],
    ) -> list[int]:
        """:meth:`renew_lease` for several ``(member, sequence)`` in one pipeline: each
        one's answer (each checks the same revisions)."""
        calls: list[ScriptCall] = [
            ("lease_renew", *self._renewal(group_id, m, ttl_ms, group_rev, stream_revs, seq))
            for m, seq in renewals
        ]
        replies = await self.run_waited_many(calls, "renewing leases")
        return [int(reply[0]) for reply in replies]

    async def sequences_of(self, group_id: str, member_ids: Sequence[str]) -> dict[str, int]:
        """The newest sequence number acted on for each of ``member_ids`` (0: none)."""
        if not member_ids:
            return {}
        raw = await self.redis.hmget(self.keyspace.group_sequences(group_id), list(member_ids))
        return {m: int(v or 0) for m, v in zip(member_ids, raw, strict=True)}

    def _renewal(
        self,
        group_id: str,
        member_id: str,
        ttl_ms: int,
        group_rev: int,
        stream_revs: Mapping[str, int],
        sequence: int | None,
    ) -> tuple[list[str], list[Any]]:
        names = sorted(stream_revs)
        keys = [
            self.keyspace.group_meta(group_id),
            self.keyspace.group_leases(group_id),
            self.keyspace.group_sequences(group_id),
            *[self.keyspace.stream_meta(n) for n in names],
        ]
        args: list[Any] = [member_id, ttl_ms, revision_token(group_rev), self.time_offset_ms]
        args.append("" if sequence is None else sequence)
        args += [revision_token(stream_revs[n]) for n in names]
        return keys, args

    async def expired_members(self, group_id: str, now_ms: int) -> list[str]:
        """Members whose lease expiry is at or before ``now_ms``."""
        raw = await self.redis.zrangebyscore(self.keyspace.group_leases(group_id), "-inf", now_ms)
        return [m.decode() for m in raw]

    async def earliest_lease(self, group_id: str) -> tuple[str, int] | None:
        """The member whose lease expires first, and when (Redis time, ms)."""
        raw = await self.redis.zrange(self.keyspace.group_leases(group_id), 0, 0, withscores=True)
        return (raw[0][0].decode(), int(raw[0][1])) if raw else None

    async def lease_expiries(self, group_id: str) -> dict[str, int]:
        """Every member's lease expiry (Redis time, ms). The reply is read as the parser
        built it: redis-py's callback formats and re-parses each score, which was most
        of a status read's CPU at 10,000 members (``bench/status_scrape.py``)."""
        key = self.keyspace.group_leases(group_id)
        raw = await call(self.redis, ["ZRANGE", key, 0, -1, "WITHSCORES"])
        if raw and isinstance(raw[0], list):  # RESP3: [member, score] pairs
            return {m.decode(): int(score) for m, score in raw}
        it = iter(raw)  # RESP2: member, score, member, score, ...
        return {m.decode(): int(float(score)) for m, score in zip(it, it, strict=True)}

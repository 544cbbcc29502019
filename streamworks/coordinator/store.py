"""The coordinator's state in Redis, and the write discipline around it.

Everything here is a thin shell over Redis; decisions are the core's. Layout
(docs/protocol.md#state-in-redis), all under the namespace's one control-plane hash tag:

* ``group:<g>`` — a hash: ``rev`` (storeRevision), ``header`` (JSON), and one field
  per member ``m:<id>`` (JSON), so a heartbeat that changes one member writes one
  field; ``group:<g>:mutex``; ``group:<g>:leases`` (member -> expiry ms, Redis time);
  ``group:<g>:changes`` — the changelog: which fields each commit wrote, newest first;
* ``stream:<s>`` — a hash: ``rev`` and ``doc`` (JSON); ``stream:<s>:mutex``;
* ``registry:*`` — every stream and group ever created, and which groups have a
  Redis consumer group on a stream's shards (tells "new" from "lost", E21).

A replica caches what it loaded *by revision*: a cached group at revision R is
exactly what Redis held at R, so comparing revisions (one ``HMGET``, or inside
``lease_renew.lua``) is enough to use it. Redis stays the only source of truth. When the
revision moved (another replica committed), the replica reads only what changed since R
(``group_delta.lua`` walks the changelog back to R and returns the changed member
records and header, atomically) and applies it (``core.changes.apply_delta``); only a
replica that cannot be bridged (changelog trimmed, history rewritten by a loss of
writes) reads the whole hash.

A revision is the pair of the hash's ``rev`` (a counter, ``max(rev + 1, Redis time ms)``)
and ``cid`` (the id of the commit that wrote it: this store's random writer id and a
counter it never reuses), packed in one ``int`` (``rev << 128 | cid``) so callers keep
comparing and caching plain ints. ``rev`` alone can repeat after Redis lost writes (a
failover to a replica whose clock is behind: the next commits count up through the lost
values); a commit id cannot, so a revision never names two different contents (E19).
Hashes written before the commit id existed read as ``cid`` 0.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import orjson

from streamworks.clock import Clock, boottime
from streamworks.coordinator.core import FenceWrite, Group, Member
from streamworks.coordinator.core.changes import apply_delta
from streamworks.coordinator.core.clock_steps import ClockReading
from streamworks.coordinator.core.streams import StreamMeta
from streamworks.coordinator.core.tokens import parse_token
from streamworks.coordinator.evidence import EvidenceReads
from streamworks.coordinator.history import fences_answered, group_committed
from streamworks.coordinator.leases import (
    LeaseOps,
    revision_of,
    revision_token,
    split_revision,
)
from streamworks.coordinator.replication import ReplicaWaits, WaitLog
from streamworks.coordinator.stream_store import StreamOps
from streamworks.exceptions import CoordinatorError
from streamworks.protocol import history
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import is_cluster
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.namespace import claim_namespace
from streamworks.redis.scripts import ScriptCall, Scripts

__all__ = (
    "Conflict",
    "MetadataUnavailable",
    "MutexHold",
    "MutexTimeout",
    "Store",
    "Survey",
    "Terminating",
)

log = logging.getLogger("streamworks.coordinator.store")

#: The server's ``TIME`` from a script on a control key (cluster: that key's node).
_TIME_LUA = "return redis.call('TIME')"

#: Seconds between two log lines about the same fail-closed problem.
_REPORT_EVERY = 10.0

#: Entries kept in a group's changelog (``group_commit.lua``): a replica that fell
#: further behind than this many commits reads the whole group instead.
CHANGELOG_LENGTH = 4096


class MetadataUnavailable(CoordinatorError):
    """Metadata of an entity that existed is missing or undecodable (E21): fail closed."""

    def __init__(self, message: str) -> None:
        super().__init__("METADATA_UNAVAILABLE", message, retryable=False, status=503)


class Conflict(CoordinatorError):
    """The compare-and-set kept losing; the request may be retried."""

    def __init__(self, message: str) -> None:
        super().__init__("CONFLICT", message, retryable=True, status=409)


class MutexTimeout(Conflict):
    """The mutex stayed taken for the whole bounded wait."""


class Terminating(CoordinatorError):
    """This replica is shutting down (E4)."""

    def __init__(self) -> None:
        super().__init__(
            "COORDINATOR_TERMINATING",
            "this coordinator replica is terminating; retry on another",
            retryable=True,
            status=503,
        )


@dataclass(frozen=True, slots=True)
class MutexHold:
    """A mutex :meth:`Store.mutex` took: ``key`` holds ``token`` until at least
    ``sent + ttl`` (:func:`~streamworks.clock.boottime`: the TTL runs in Redis, in real
    time; ``sent``: when the winning ``SET`` left)."""

    key: str
    token: str
    ttl: float
    sent: float


@dataclass(frozen=True, slots=True)
class Survey:
    """What the event loop reads of every group and stream in one pipeline.

    Attributes:
        group_revs: group -> revision of its metadata (0: none).
        earliest_leases: group -> the member whose lease runs out first and when.
        stream_revs: stream -> revision of its metadata (0: none).
    """

    group_revs: Mapping[str, int]
    earliest_leases: Mapping[str, tuple[str, int] | None]
    stream_revs: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Loaded:
    """A group as loaded: the group (None when it does not exist yet) and its rev."""

    group: Group | None
    rev: int
    now_ms: int


class Store(EvidenceReads, LeaseOps, StreamOps):
    """Reads and writes the control plane in Redis."""

    def __init__(
        self,
        redis: Any,
        keyspace: Keyspace,
        *,
        mutex_ttl: float = 5.0,
        mutex_wait: float = 2.0,
        clock: Clock | None = None,
        waits: ReplicaWaits | None = None,
    ) -> None:
        self.clock = clock or Clock()
        self.redis = redis
        self.keyspace = keyspace
        self.scripts = Scripts(redis)
        #: Control-plane writes wait for replicas through this (``replication.py``).
        self.waits = waits or ReplicaWaits(redis, self.scripts)
        #: Called with every reading of Redis ``TIME`` (the replica's clock-step
        #: detector, ``core/clock_steps.py``).
        self.on_time: Callable[[ClockReading], None] | None = None
        #: Test hook: added to every Redis ``TIME`` this store reads (and to the time
        #: its scripts read), unlike the clock's offset, as a step of the server's own
        #: clock would be (issue 18, finding 6).
        self.time_skew_ms = 0
        self._cluster = is_cluster(redis)
        self._mutex_ms = int(mutex_ttl * 1000)
        self._mutex_wait = mutex_wait
        self._groups: dict[str, tuple[int, Group]] = {}
        self._streams: dict[str, tuple[int, StreamMeta]] = {}
        self._reported: dict[str, float] = {}  # fail-closed problem -> last logged
        #: Called with the key each time :meth:`mutex` finds a mutex taken (tests use it
        #: to interleave two critical sections without sleeping).
        self.on_contended: Callable[[str], None] | None = None
        # Commit ids: a random writer id per store, and a counter never reused by it.
        self._writer = secrets.randbits(64)
        self._commits = itertools.count(1)

    # -- namespace identity ------------------------------------------------------------
    async def claim_namespace(self) -> str:
        """The namespace id, created if missing (``SET NX``; ``redis/namespace.py``)."""
        return await claim_namespace(self.redis, self.keyspace)

    # -- time and mutexes ------------------------------------------------------------
    @property
    def time_offset_ms(self) -> int:
        """Added to Redis ``TIME``: the test clock's offset (and the test skew hook)."""
        return self.clock.offset_ms + self.time_skew_ms

    async def now_ms(self) -> int:
        """Redis server time in ms: every deadline uses the same clock
        (docs/protocol.md#principles)."""
        before = boottime()
        if self._cluster:
            seconds, micros = await self.redis.eval(_TIME_LUA, 1, self.keyspace.registry_groups())
        else:
            seconds, micros = await self.redis.time()
        return self._saw_time(int(seconds) * 1000 + int(micros) // 1000, before)

    def _saw_time(self, redis_ms: int, before: float) -> int:
        """Report a reading of Redis ``TIME`` taken since local time ``before``; returns
        it as the store's callers use it (with the offsets)."""
        redis_ms += self.time_skew_ms
        if self.on_time is not None:
            self.on_time(ClockReading(redis_ms, before, boottime()))
        return redis_ms + self.clock.offset_ms

    def saw_script_time(self, redis_ms: int, before: float) -> None:
        """Report Redis time read by a script since local time ``before`` (with the skew
        hook's, without the clock offset)."""
        if self.on_time is not None:
            self.on_time(ClockReading(redis_ms, before, boottime()))

    async def run_waited(self, name: str, keys: list[Any], args: list[Any], what: str) -> Any:
        """Run a script whose write must reach the replicas before it counts; raises
        :class:`NotReplicated` (retryable) when too few acknowledged it."""
        log = self.waits.log()
        reply = await self.waits.run(name, keys, args, log)
        log.check(what)
        return reply

    async def run_waited_many(self, calls: Sequence[ScriptCall], what: str) -> list[Any]:
        """:meth:`run_waited` for several calls (one write per node)."""
        log = self.waits.log()
        replies = await self.waits.run_many(calls, log)
        log.check(what)
        return replies

    def _queue_time(self, pipe: Any) -> None:
        """Queue the control node's ``TIME`` on ``pipe``. A cluster pipeline refuses
        keyless ``TIME`` (and a cluster client would ask any node): a script on a
        control key runs it on the node whose clock the control scripts use."""
        if self._cluster:
            pipe.execute_command("EVAL", _TIME_LUA, 1, self.keyspace.registry_groups())
        else:
            pipe.time()

    @contextlib.asynccontextmanager
    async def mutex(self, key: str) -> AsyncIterator[MutexHold]:
        """Hold ``key`` (``SET NX PX``) for the block; bounded wait with backoff. Yields
        the hold (its token, and when the winning ``SET`` was sent), for a caller that
        extends it (``discipline.py``).

        Raises:
            MutexTimeout: still taken after ``mutex_wait`` seconds.
        """
        token = secrets.token_hex(8)
        deadline = boottime() + self._mutex_wait
        delay = 0.001
        sent = boottime()
        while not await self.redis.set(key, token, nx=True, px=self._mutex_ms):
            if self.on_contended is not None:
                self.on_contended(key)
            if boottime() > deadline:
                raise MutexTimeout(f"{key} stayed locked for {self._mutex_wait}s")
            await self.clock.sleep(delay)  # backoff against a lock held in another process
            delay = min(delay * 2, 0.05)
            sent = boottime()
        try:
            yield MutexHold(key, token, self._mutex_ms / 1000, sent)
        finally:
            with anyio.CancelScope(shield=True):
                released = await self.scripts.mutex_release(keys=[key], args=[token])
                if not released:
                    log.warning("mutex %s expired while held (its CAS still protected it)", key)

    def _new_cid(self) -> int:
        """A commit id no other commit has, of this store or any other."""
        return (self._writer << 64) | next(self._commits)

    def unavailable(self, message: str) -> MetadataUnavailable:
        """The fail-closed error for ``message`` (E21), logged so an operator sees what
        is missing: once per problem per 10 s, however many members keep retrying."""
        now = boottime()
        if now - self._reported.get(message, -_REPORT_EVERY) >= _REPORT_EVERY:
            if len(self._reported) > 1000:
                self._reported.clear()
            self._reported[message] = now
            log.error("metadata unavailable, failing closed: %s", message)
        return MetadataUnavailable(message)

    # -- groups ----------------------------------------------------------------------
    def cached_group(self, group_id: str) -> tuple[int, Group] | None:
        return self._groups.get(group_id)

    async def load_group(self, group_id: str) -> Loaded:
        """Load a group (from the cache when its revision did not move).

        Raises:
            MetadataUnavailable: the group is registered but its metadata is missing
                or undecodable (E21).
        """
        key = self.keyspace.group_meta(group_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(key, ["rev", "cid"])
        self._queue_time(pipe)
        before = boottime()
        (raw_rev, raw_cid), (seconds, micros) = await pipe.execute()
        now_ms = self._saw_time(int(seconds) * 1000 + int(micros) // 1000, before)
        rev = revision_of(raw_rev, raw_cid)
        if rev == 0 and await self.redis.sismember(self.keyspace.registry_groups(), group_id):
            # A commit writes the revision and the registry entry in one script: if the
            # entry is visible now, so is the revision, unless the metadata is gone.
            # (Reading the revision again closes the race with a group created between
            # the two reads.)
            rev = revision_of(*await self.redis.hmget(key, ["rev", "cid"]))
        if rev == 0:
            if await self.redis.sismember(self.keyspace.registry_groups(), group_id):
                raise self.unavailable(
                    f"group {group_id!r} is registered but its metadata is missing; "
                    "an operator must re-initialise it (streamworks admin reinit group)"
                )
            return Loaded(None, 0, now_ms)
        cached = self._groups.get(group_id)
        if cached is not None and cached[0] == rev:
            return Loaded(cached[1], rev, now_ms)
        if cached is not None:
            caught_up = await self._catch_up(group_id, *cached)
            if caught_up is not None:
                self._groups[group_id] = caught_up
                return Loaded(caught_up[1], caught_up[0], now_ms)
        fields = await self.redis.hgetall(key)
        try:
            rev = revision_of(int(fields[b"rev"]), fields.get(b"cid"))
            header = orjson.loads(fields[b"header"])
            members = [
                Member.from_dict(orjson.loads(value))
                for name, value in fields.items()
                if name.startswith(b"m:")
            ]
            group = Group.from_header(header, members)
        except (KeyError, ValueError, orjson.JSONDecodeError) as e:
            raise self.unavailable(f"group {group_id!r} metadata is corrupt: {e}") from e
        self._groups[group_id] = (rev, group)
        return Loaded(group, rev, now_ms)

    async def _catch_up(self, group_id: str, rev: int, group: Group) -> tuple[int, Group] | None:
        """The group at its current revision from ``group`` at ``rev`` and the changes
        committed since (``group_delta.lua``: only the changed member records, and the
        header if it changed); None when the changelog cannot bridge the two (the
        caller reads the whole hash).

        Raises:
            MetadataUnavailable: a changed record is undecodable.
        """
        reply = await self.scripts.group_delta(
            keys=[self.keyspace.group_meta(group_id), self.keyspace.group_changes(group_id)],
            args=[revision_token(rev), CHANGELOG_LENGTH],
        )
        code = int(reply[0])
        if code == 0:
            return rev, group
        if code != 1:
            return None
        try:
            new_rev = revision_of(int(reply[1]), reply[2])
            header = orjson.loads(reply[3]) if reply[3] else None
            upserts: list[Member] = []
            removed: list[str] = []
            for j in range(4, len(reply), 2):
                member_id, doc = reply[j].decode(), reply[j + 1]
                if doc is None:
                    removed.append(member_id)
                else:
                    upserts.append(Member.from_dict(orjson.loads(doc)))
            return new_rev, apply_delta(group, header, upserts, removed)
        except (ValueError, orjson.JSONDecodeError) as e:
            raise self.unavailable(f"group {group_id!r} metadata is corrupt: {e}") from e

    async def commit_group(
        self,
        rev: int,
        group: Group,
        *,
        header_changed: bool,
        changed: Iterable[str],
        removed: Iterable[str],
        now_ms: int,
        renew: Sequence[str] = (),
        expect_expired: Sequence[str] = (),
        sequences: Mapping[str, int] | None = None,
        lease_ttl_ms: int,
        waits: WaitLog | None = None,
    ) -> int | None:
        """Write what changed if the group is still at ``rev``; returns the new rev, or
        None when another writer committed first (or a member expected expired renewed,
        or a newer request of a member in ``sequences`` was acted on meanwhile).
        Members that are no longer live lose their lease entry in the same script; the
        request sequence numbers in ``sequences`` are recorded with it.

        The write waits for the replicas (``replication.py``): with ``waits`` the
        outcome is noted there (the caller checks it after its later writes, whose
        ``WAIT`` may cover this one); without, :class:`NotReplicated` is raised now.
        """
        removed = list(removed)
        upserts: list[Any] = []
        unlease: list[str] = []
        for member_id in changed:
            member = group.members.get(member_id)
            if member is not None:
                upserts += (member_id, orjson.dumps(member.to_dict()))
                if not member.is_live:
                    unlease.append(member_id)
        header = orjson.dumps(group.to_header()) if header_changed or rev == 0 else b""
        expected, expected_cid = split_revision(rev)
        cid = self._new_cid()
        args: list[Any] = [expected, expected_cid, cid, group.group_id, header, lease_ttl_ms]
        args.append(now_ms)
        args += [len(upserts) // 2, *upserts]
        args += [len(removed), *removed, len(renew), *renew, len(unlease), *unlease]
        args += [len(expect_expired), *expect_expired]
        acted = sorted((sequences or {}).items())
        args += [len(acted), *[x for pair in acted for x in pair], CHANGELOG_LENGTH]
        group_id = group.group_id
        keys: list[Any] = [
            self.keyspace.group_meta(group_id),
            self.keyspace.registry_groups(),
            self.keyspace.group_leases(group_id),
            self.keyspace.group_changes(group_id),
            self.keyspace.group_sequences(group_id),
        ]
        log = waits or self.waits.log()
        sent = history.now()  # None unless a history is recorded
        reply = await self.waits.run("group_commit", keys, args, log)
        if waits is None:
            log.check(f"committing group {group_id!r}")
        if reply[0] != 1:
            self._groups.pop(group.group_id, None)
            return None
        new_rev = revision_of(int(reply[1]), cid)
        group_committed(group_id, new_rev, sent)
        self._groups[group.group_id] = (new_rev, group)
        return new_rev

    async def survey(self, groups: Sequence[str], streams: Sequence[str]) -> Survey:
        """Revisions of ``groups`` and ``streams`` and each group's earliest lease, in one
        pipelined round trip (the loop tells idle groups and streams from due ones by
        these, without a round trip per entity)."""
        if not groups and not streams:
            return Survey({}, {}, {})
        pipe = self.redis.pipeline(transaction=False)
        for group_id in groups:
            pipe.hmget(self.keyspace.group_meta(group_id), ["rev", "cid"])
            pipe.zrange(self.keyspace.group_leases(group_id), 0, 0, withscores=True)
        for name in streams:
            pipe.hmget(self.keyspace.stream_meta(name), ["rev", "cid"])
        replies = await pipe.execute()
        group_revs: dict[str, int] = {}
        earliest: dict[str, tuple[str, int] | None] = {}
        for j, group_id in enumerate(groups):
            group_revs[group_id] = revision_of(*replies[2 * j])
            first = replies[2 * j + 1]
            earliest[group_id] = (first[0][0].decode(), int(first[0][1])) if first else None
        offset = 2 * len(groups)
        stream_revs = {n: revision_of(*replies[offset + j]) for j, n in enumerate(streams)}
        return Survey(group_revs, earliest, stream_revs)

    async def registered_groups(self) -> list[str]:
        return sorted(
            m.decode() for m in await self.redis.smembers(self.keyspace.registry_groups())
        )

    async def group_meta_fields(self, group_id: str) -> tuple[bool, bool]:
        """Whether the group's metadata hash has a ``rev`` and a ``header`` field (an
        operator re-initialises only a group whose header is gone)."""
        rev, header = await self.redis.hmget(self.keyspace.group_meta(group_id), ["rev", "header"])
        return rev is not None, header is not None

    async def delete_group_meta(self, group_id: str) -> None:
        """Delete what is left of a group's metadata hash (operator recovery, E21)."""
        await self.redis.delete(
            self.keyspace.group_meta(group_id), self.keyspace.group_changes(group_id)
        )
        self._groups.pop(group_id, None)

    async def highest_fence_token(self, group_id: str) -> int:
        """The highest token in any owner fence of ``group_id`` (a SCAN; used when an
        operator re-initialises a group, so new tokens are above all of them)."""
        pattern = self.keyspace.fence_pattern(group_id)
        highest = 0
        async for key in self.redis.scan_iter(match=pattern, count=1000):
            value = await self.redis.get(key)
            if value:
                highest = max(highest, parse_token(value.decode(errors="replace")) or 0)
        return highest

    # -- subscriptions and fences ----------------------------------------------------
    async def subscribed_groups(self, stream: str) -> set[str]:
        raw = await self.redis.smembers(self.keyspace.registry_subscriptions(stream))
        return {m.decode() for m in raw}

    async def record_subscription(self, stream: str, group: str) -> None:
        await self.redis.sadd(self.keyspace.registry_subscriptions(stream), group)

    async def remove_subscription(self, stream: str, group: str) -> None:
        """Take ``group`` off the stream's subscription registry (unsubscribe, after its
        consumer groups are gone from every shard: ``provision.destroy_group``)."""
        await self.redis.srem(self.keyspace.registry_subscriptions(stream), group)

    async def write_fences(
        self,
        group_id: str,
        fences: Iterable[FenceWrite],
        *,
        known_token: int,
        waits: WaitLog | None = None,
    ) -> list[tuple[FenceWrite, str]]:
        """Write owner fences (monotonic, ``fence.lua``), pipelined, waiting for the
        replicas (noted in ``waits``, or raised at once without it); returns the refused
        ones with the fence found in their place. ``known_token``: the highest token the
        metadata the grants were decided on recorded (a fence of another member above
        it is a grant Redis lost)."""
        fences = list(fences)
        if not fences:
            return []
        calls: list[ScriptCall] = []
        for fence in fences:
            shard = ShardId.parse(fence.shard)
            keys = [self.keyspace.fence(shard, group_id), self.keyspace.stream(shard)]
            calls.append(("fence", keys, [fence.token, fence.member_id, known_token]))
        # One pipeline per node on a cluster, loading fence.lua where a node lost it.
        log = waits or self.waits.log()
        sent = history.now()
        replies = await self.waits.run_many(calls, log)
        fences_answered(group_id, fences, replies, sent)
        if waits is None:
            log.check(f"writing the owner fences of group {group_id!r}")
        refused = []
        for fence, reply in zip(fences, replies, strict=True):
            if reply[0] == 0:  # (-2: the shard was retired meanwhile, nothing to fence)
                current = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
                refused.append((fence, current))
        return refused

"""One coordinator replica: the write discipline around the pure core.

Every mutation is a *critical section* (PROTOCOL §3): the local gate (refused with
``COORDINATOR_TERMINATING`` once this replica terminates, E4), the Redis mutex, a
load of the metadata and its ``storeRevision``, the core's pure decision, a
compare-and-set commit, and the mutex release. Steps past the gate are shielded from
cancellation, so a terminating replica finishes what it started. A lost CAS reloads
and retries, bounded; then ``CONFLICT`` (retryable).

A heartbeat that changes nothing takes a shorter road: the core decides on the
cached group, and ``lease_renew.lua`` renews the lease in one round trip only if the
cached revisions are still current — otherwise the full critical section runs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import anyio
from redis.exceptions import RedisError

from streamworks.clock import Clock
from streamworks.coordinator import provision
from streamworks.coordinator.core import (
    CoreConfig,
    Group,
    HeartbeatInput,
    HeartbeatResult,
    InvalidHeartbeat,
    Member,
    heartbeat,
)
from streamworks.coordinator.core.changes import TimerResult
from streamworks.coordinator.core.migrations import migration_phase
from streamworks.coordinator.core.model import Topology
from streamworks.coordinator.core.recovery import empty_group, fence_after_regression
from streamworks.coordinator.core.streams import (
    ShardRecord,
    ShardState,
    StreamMeta,
    new_stream,
    topology_of,
)
from streamworks.coordinator.core.tick import tick
from streamworks.coordinator.metrics import CoordinatorMetrics
from streamworks.coordinator.resharding import Resharder
from streamworks.coordinator.store import Conflict, MetadataUnavailable, Store, Terminating
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.control import (
    GroupInfo,
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatStatus,
    MemberInfo,
    ReinitializeRequest,
    RoutingResponse,
    RoutingShard,
    ShardGrant,
    ShardGroupInfo,
    ShardInfo,
    StatusResponse,
    StreamInfo,
    UnsubscribeRequest,
)
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.namespace import claim_namespace
from streamworks.settings import Settings

#: How long after another member's lease deadline a member is asked to heartbeat, so
#: that the loop (which wakes at the deadline) has expired it and moved its shards.
_AFTER_EXPIRY_MS = 100

__all__ = ("CoordinatorService", "core_config")

log = logging.getLogger("streamworks.coordinator")


def core_config(settings: Settings) -> CoreConfig:
    """The core's timing knobs from settings (seconds -> ms)."""
    interval = int(settings.heartbeat_interval * 1000)
    return CoreConfig(
        lease_ttl_ms=int(settings.lease_ttl * 1000),
        rebalance_timeout_ms=int(settings.rebalance_timeout * 1000),
        heartbeat_interval_ms=interval,
        fast_heartbeat_interval_ms=max(20, min(200, interval // 5)),
        stale_member_retention_ms=max(1, int(settings.stale_member_retention * 1000)),
        assignment_interval_ms=int(settings.coordinator.assignment_interval * 1000),
    )


class CoordinatorService:
    """The coordinator's operations, shared by the HTTP API, the event loop and the
    in-process transport of ``TestRuntime``."""

    def __init__(
        self,
        redis: Any,
        settings: Settings,
        *,
        replica: str = "replica",
        clock: Clock | None = None,
    ) -> None:
        self.clock = clock or Clock()
        self.settings = settings
        self.replica = replica
        self.keyspace = Keyspace(settings.key_prefix)
        self.store = Store(
            redis,
            self.keyspace,
            mutex_ttl=settings.coordinator.mutex_ttl,
            mutex_wait=settings.coordinator.mutex_wait,
            clock=self.clock,
        )
        self.redis = redis
        self.config = core_config(settings)
        self.metrics = CoordinatorMetrics()
        self.namespace_id: str | None = None  # claimed on the first heartbeat or routing
        self.terminating = False
        self._inflight = 0
        self._drained = anyio.Event()
        self._local_locks: dict[str, anyio.Lock] = {}
        # (stream, group, layout version) whose consumer groups are known to exist.
        self._subscribed: set[tuple[str, str, int]] = set()
        self.resharder = Resharder(self)
        self._loop_warned: dict[str, float] = {}
        self._streams_cache: dict[tuple[str, int], frozenset[str]] = {}
        # Per group, the member whose lease runs out first and when (Redis time, ms),
        # as the loop last saw the lease set.
        self._next_expiry: dict[str, tuple[str, int]] = {}
        self._topology_cache: dict[tuple[tuple[str, int], ...], Topology] = {}
        # Last Redis time seen and the monotonic time it was seen at: the fast path's
        # estimate of Redis time.
        self._clock: tuple[int, float] = (0, 0.0)

    # -- the write discipline -----------------------------------------------------------
    @contextlib.asynccontextmanager
    async def critical(self, mutex_key: str) -> AsyncIterator[None]:
        """A critical section on ``mutex_key``: gate, mutex, shielded body, release.

        Requests for the same key queue on a local lock first, so a burst (a fleet of
        workers joining at once) takes the Redis mutex one at a time instead of all
        polling it; the Redis mutex then only arbitrates between replicas.
        """
        if self.terminating:
            raise Terminating()
        lock = self._local_locks.setdefault(mutex_key, anyio.Lock())
        async with lock:
            if self.terminating:
                raise Terminating()  # still before the gate: nothing started
            self._inflight += 1
            try:
                with anyio.CancelScope(shield=True):
                    async with self.store.mutex(mutex_key):
                        yield
            finally:
                self._inflight -= 1
                if self.terminating and self._inflight == 0:
                    self._drained.set()

    async def terminate(self, timeout: float = 10.0) -> None:
        """Enter terminating mode (E4) and wait for in-flight critical sections."""
        self.terminating = True
        if self._inflight == 0:
            return
        with anyio.move_on_after(timeout):
            await self._drained.wait()

    async def redis_ok(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except Exception:
            return False

    def log_unexpected(self, exc: BaseException) -> None:
        log.error("unexpected error: %r", exc, exc_info=exc)

    # -- heartbeats ---------------------------------------------------------------------
    async def ensure_namespace(self) -> str:
        """The namespace id, written once (``SET NX``) and cached (``redis/namespace.py``)."""
        if self.namespace_id is None:
            self.namespace_id = await claim_namespace(self.redis, self.keyspace)
        return self.namespace_id

    async def heartbeat(self, group_id: str, body: HeartbeatRequest) -> HeartbeatResponse:
        started = time.perf_counter()
        await self.ensure_namespace()
        request = HeartbeatInput(
            member_id=body.member_id,
            member_epoch=body.member_epoch,
            metadata_version=body.metadata_version,
            subscriptions=frozenset(body.subscriptions) if body.subscriptions is not None else None,
            owned=frozenset(body.owned_shards) if body.owned_shards is not None else None,
            revoking=frozenset(body.revoking_shards),
            rebalance_timeout_ms=body.rebalance_timeout_ms,
            client=body.client,
            fence_failed=frozenset(body.fenced_shards),
        )
        try:
            response = await self._fast_heartbeat(group_id, request)
            path = "fast"
            if response is None:
                path = "full"
                response = await self._full_heartbeat(group_id, request)
        except InvalidHeartbeat as e:
            raise CoordinatorError("INVALID_REQUEST", str(e), status=400) from e
        except MetadataUnavailable:
            self.metrics.unavailable.inc()
            raise
        self.metrics.heartbeats.labels(path, response.status.value).inc()
        self.metrics.heartbeat_seconds.observe(time.perf_counter() - started)
        return response

    async def _fast_heartbeat(
        self, group_id: str, request: HeartbeatInput
    ) -> HeartbeatResponse | None:
        if request.member_epoch <= 0 or self.terminating:
            return None
        cached = self.store.cached_group(group_id)
        if cached is None:
            return None
        rev, group = cached
        member = group.members.get(request.member_id)
        if member is None or not member.is_live:
            return None
        streams = self._group_streams(group_id, rev, group)
        if request.subscriptions is not None and not request.subscriptions <= streams:
            return None
        metas: dict[str, StreamMeta] = {}
        stream_revs: dict[str, int] = {}
        for name in streams:
            entry = self.store.cached_stream(name)
            if entry is None:
                return None
            stream_revs[name], metas[name] = entry
        # Decide on the cached state with an estimate of Redis time; only a decision
        # that changes nothing is used, and only if the revisions are still current.
        topology = self._topology_of(stream_revs, metas)
        result = heartbeat(group, topology, request, self._estimated_now(), self.config)
        if not result.is_noop or result.status.value != HeartbeatStatus.OK.value:
            return None
        renewed, now_ms = await self.store.renew_lease(
            group_id, request.member_id, self.config.lease_ttl_ms, rev, stream_revs
        )
        self._clock = (now_ms - self.clock.offset_ms, time.monotonic())
        if not renewed:
            return None
        return self._response(result, request.member_id, group_id)

    def _estimated_now(self) -> int:
        redis_ms, at = self._clock  # Redis time without the test offset
        if not redis_ms:
            redis_ms, at = int(time.time() * 1000), time.monotonic()
        return redis_ms + int((time.monotonic() - at) * 1000) + self.clock.offset_ms

    def _group_streams(self, group_id: str, rev: int, group: Group) -> frozenset[str]:
        """Streams the group's live members subscribe to (cached per group revision)."""
        key = (group_id, rev)
        cached = self._streams_cache.get(key)
        if cached is None:
            cached = frozenset(_subscriptions(group.members.values()))
            if len(self._streams_cache) > 1024:
                self._streams_cache.clear()
            self._streams_cache[key] = cached
        return cached

    def _topology_of(self, revs: Mapping[str, int], metas: Mapping[str, StreamMeta]) -> Topology:
        """The core's topology of these streams (cached per stream revisions)."""
        key = tuple(sorted(revs.items()))
        cached = self._topology_cache.get(key)
        if cached is None:
            cached = topology_of(metas)
            if len(self._topology_cache) > 1024:
                self._topology_cache.clear()
            self._topology_cache[key] = cached
        return cached

    async def _full_heartbeat(self, group_id: str, request: HeartbeatInput) -> HeartbeatResponse:
        async with self.critical(self.keyspace.group_mutex(group_id)):
            for _ in range(self.settings.coordinator.cas_retries):
                loaded = await self.store.load_group(group_id)
                self._clock = (loaded.now_ms - self.clock.offset_ms, time.monotonic())
                group = loaded.group
                if group is None:
                    if request.member_epoch != 0:
                        group = Group(group_id)  # unknown group: the core answers UNKNOWN_MEMBER
                    else:
                        group = await self._new_group(group_id, request.subscriptions or ())
                names = set(self._group_streams(group_id, loaded.rev, group))
                names |= request.subscriptions or frozenset()
                loaded_streams = await self.store.load_streams(names)
                metas = {n: m for n, (_, m) in loaded_streams.items() if m is not None}
                topology = self._topology_of({n: r for n, (r, _) in loaded_streams.items()}, metas)
                result = heartbeat(group, topology, request, loaded.now_ms, self.config)
                if not loaded.rev and result.status.value == HeartbeatStatus.UNKNOWN_MEMBER.value:
                    # A group that does not exist: nothing to write, and in particular no
                    # group created from what an unknown member reports (E20).
                    return self._response(result, request.member_id, group_id)
                # Consumer groups are provisioned (and the subscription registered, the
                # evidence E21 relies on) only for a group that exists in Redis or is
                # committed now, never for a request that fails validation or a refusal.
                wanted = (
                    _subscriptions(result.group.members.values())
                    if result.changed_members
                    else self._group_streams(group_id, loaded.rev, group)
                )
                subscribed = {n: m for n, m in metas.items() if n in wanted}
                if result.is_noop and loaded.rev:
                    await self._ensure_subscriptions(group_id, subscribed)
                    if not result.renews_lease:
                        return self._response(result, request.member_id, group_id)
                    revs = {n: r for n, (r, _) in loaded_streams.items()}
                    renewed, _ = await self.store.renew_lease(
                        group_id, request.member_id, self.config.lease_ttl_ms, loaded.rev, revs
                    )
                    if renewed:
                        return self._response(result, request.member_id, group_id)
                    # The lease entry ran out before the loop expired the member: the
                    # member is still live in the metadata, so renewing is what a
                    # heartbeat in time would have done; it takes a commit.
                elif result.is_noop and not result.renews_lease:
                    return self._response(result, request.member_id, group_id)
                new_rev = await self.store.commit_group(
                    loaded.rev,
                    result.group,
                    now_ms=loaded.now_ms,
                    header_changed=result.header_changed,
                    changed=result.changed_members,
                    removed=result.removed_members,
                    renew=[request.member_id] if result.renews_lease else [],
                    lease_ttl_ms=self.config.lease_ttl_ms,
                )
                if new_rev is None:
                    self.metrics.conflicts.inc()
                    continue
                await self._ensure_subscriptions(group_id, subscribed)  # before any grant
                if result.group.target_epoch != group.target_epoch:
                    self.metrics.rebalances.labels(group_id).inc()
                self._observe(result.group)
                refused = await self.store.write_fences(group_id, result.fences)
                if refused:
                    return await self._after_refused_fence(
                        group_id, new_rev, result.group, request, refused
                    )
                return self._response(result, request.member_id, group_id)
        raise Conflict(f"group {group_id!r}: lost the compare-and-set repeatedly; retry")

    async def _after_refused_fence(
        self,
        group_id: str,
        rev: int,
        group: Group,
        request: HeartbeatInput,
        refused: list[tuple[Any, str]],
    ) -> HeartbeatResponse:
        """A fence holds a newer epoch than this grant: Redis lost group writes (E19).
        Fence the member and raise the group epoch above the fence; the member rejoins
        and receives grants with epochs no fence has seen."""
        highest = max(int(current.split(":", 1)[0] or 0) for _, current in refused)
        log.warning(
            "group %s: owner fence(s) newer than the recorded epochs (highest %d): metadata "
            "lost writes; fencing member %s and raising the group epoch",
            group_id,
            highest,
            request.member_id,
        )
        now = await self.store.now_ms()
        step = fence_after_regression(group, request.member_id, highest, now)
        await self.store.commit_group(
            rev,
            step.group,
            now_ms=now,
            header_changed=step.header_changed,
            changed=step.changed_members,
            removed=step.removed_members,
            lease_ttl_ms=self.config.lease_ttl_ms,
        )
        return HeartbeatResponse(
            status=HeartbeatStatus.FENCED,
            member_id=request.member_id,
            member_epoch=0,
            group_epoch=step.group.group_epoch,
            metadata_version=step.group.metadata_version,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            lease_ttl_ms=self.config.lease_ttl_ms,
            key_prefix=self.keyspace.prefix,
            namespace_id=self.namespace_id,
        )

    async def _new_group(self, group_id: str, subscriptions: Iterable[str]) -> Group:
        """A group joining for the first time. If Redis shows it existed (its consumer
        group is registered on a stream it subscribes to) while its metadata and
        registry entry are gone: fail closed (E21)."""
        for stream in subscriptions:
            if group_id in await self.store.subscribed_groups(stream):
                raise self.store.unavailable(
                    f"group {group_id!r} has consumer groups on stream {stream!r} but no "
                    "metadata: it existed and its metadata was lost; an operator must "
                    "re-initialise it (streamworks admin reinit group)"
                )
        return Group(group_id)

    async def _ensure_subscriptions(self, group_id: str, metas: Mapping[str, StreamMeta]) -> None:
        """Before any shard of a stream is granted to a group, the group's Redis
        consumer group exists on every assignable shard of it (PROTOCOL §4)."""
        for name, meta in metas.items():
            # Per layout version: a scale-out racing a group's first subscription may
            # have created shards without this group's consumer group; creating it is
            # idempotent, so each replica checks once per layout.
            seen = (name, group_id, meta.layout_version)
            if seen in self._subscribed:
                continue
            if group_id in await self.store.subscribed_groups(name):
                shards = [ShardId.parse(s) for s in meta.shard_ids(meta.assignable())]
                await provision.create_group(
                    self.store.scripts, self.keyspace, shards, group_id, "earliest"
                )
                self._subscribed.add(seen)
                continue
            shards = [ShardId.parse(s) for s in meta.shard_ids(meta.assignable())]
            missing = await provision.create_group(
                self.store.scripts, self.keyspace, shards, group_id, "earliest"
            )
            if missing:
                log.error("stream %s: shard keys missing for %s", name, [str(s) for s in missing])
            await self.store.record_subscription(name, group_id)
            self._subscribed.add(seen)
            log.info("group %s subscribed to %s: consumer groups created", group_id, name)

    def _response(
        self, result: HeartbeatResult, member_id: str, group_id: str
    ) -> HeartbeatResponse:
        interval = result.heartbeat_interval_ms
        soon = self._next_expiry.get(group_id)
        if soon is not None and soon[0] != member_id:
            # Another member's lease runs out before this member's next heartbeat (it
            # stopped heartbeating): come back just after the loop expires it, to pick
            # up its shards then rather than up to a whole interval later. Failover
            # takes the lease TTL, not TTL + interval.
            until = soon[1] - self._estimated_now() + _AFTER_EXPIRY_MS
            if 0 < until < interval:
                interval = until
        return HeartbeatResponse(
            status=HeartbeatStatus(result.status.value),
            member_id=member_id,
            member_epoch=result.member_epoch,
            group_epoch=result.group.group_epoch,
            metadata_version=result.group.metadata_version,
            assigned=[ShardGrant(shard=s, epoch=e) for s, e in sorted(result.assigned.items())],
            pending=sorted(result.pending),
            revoke=sorted(result.revoke),
            heartbeat_interval_ms=interval,
            lease_ttl_ms=result.lease_ttl_ms,
            key_prefix=self.keyspace.prefix,
            namespace_id=self.namespace_id,
        )

    def _observe(self, group: Group) -> None:
        self.metrics.group_epoch.labels(group.group_id).set(group.group_epoch)
        self.metrics.members.labels(group.group_id).set(len(group.live_members()))

    # -- the event loop -----------------------------------------------------------------
    async def tick_group(self, group_id: str) -> bool:
        """Run the due timer steps of one group (expiry, revocation deadlines, stale
        records, batched targets). Decides on a plain read first and takes the mutex
        only when something is due. Returns whether anything was committed."""
        loaded = await self.store.load_group(group_id)
        if loaded.group is None:
            return False
        self._clock = (loaded.now_ms - self.clock.offset_ms, time.monotonic())
        earliest = await self.store.earliest_lease(group_id)
        if earliest is None:
            self._next_expiry.pop(group_id, None)
        else:
            self._next_expiry[group_id] = earliest
        # The first lease still ahead means no lease ran out: no need to ask for them.
        expired_now = earliest is not None and earliest[1] <= loaded.now_ms
        if self._due(
            loaded.group,
            await self.store.expired_members(group_id, loaded.now_ms) if expired_now else [],
            await self._topology(loaded.group),
            loaded.now_ms,
        ).is_noop:
            return False
        async with self.critical(self.keyspace.group_mutex(group_id)):
            for _ in range(self.settings.coordinator.cas_retries):
                loaded = await self.store.load_group(group_id)
                if loaded.group is None:
                    return False
                expired = await self.store.expired_members(group_id, loaded.now_ms)
                result = self._due(
                    loaded.group, expired, await self._topology(loaded.group), loaded.now_ms
                )
                if result.is_noop:
                    return False
                newly_expired = [
                    m
                    for m in expired
                    if m in loaded.group.members and loaded.group.members[m].is_live
                ]
                rev = await self.store.commit_group(
                    loaded.rev,
                    result.group,
                    now_ms=loaded.now_ms,
                    header_changed=result.header_changed,
                    changed=result.changed_members,
                    removed=result.removed_members,
                    expect_expired=newly_expired,
                    lease_ttl_ms=self.config.lease_ttl_ms,
                )
                if rev is None:
                    self.metrics.conflicts.inc()
                    continue
                for member_id in newly_expired:
                    log.info("group %s: member %s expired (lease)", group_id, member_id)
                    self.metrics.expirations.labels(group_id, "lease").inc()
                if result.group.target_epoch != loaded.group.target_epoch:
                    self.metrics.rebalances.labels(group_id).inc()
                self._observe(result.group)
                return True
        raise Conflict(f"group {group_id!r}: lost the compare-and-set repeatedly")

    def _due(
        self, group: Group, expired: list[str], topology: Topology, now_ms: int
    ) -> TimerResult:
        return tick(group, expired, topology, now_ms, self.config)

    async def _topology(self, group: Group) -> Topology:
        names = _subscriptions(group.members.values())
        loaded = await self.store.load_streams(names)
        return topology_of({n: m for n, (_, m) in loaded.items() if m is not None})

    async def run_loop(self) -> None:
        """The event loop of this replica (every replica runs it; the write discipline
        makes concurrent runs safe). Runs until cancelled or terminating."""
        interval = self.settings.coordinator.loop_interval
        while not self.terminating:
            try:
                for group_id in await self.store.registered_groups():
                    if self.terminating:
                        break
                    try:
                        await self.tick_group(group_id)
                    except MetadataUnavailable:
                        pass  # logged (rate-limited) where it is raised
                    except Conflict as e:
                        self._loop_warning(f"group {group_id}: {e.message}")
                await self.tick_streams()
            except MetadataUnavailable:
                pass
            except CoordinatorError as e:
                if isinstance(e, Terminating):
                    break
                self._loop_warning(str(e))
            except (OSError, RedisError) as e:
                self._loop_warning(f"Redis unavailable: {e}")
            await anyio.sleep(self._loop_sleep(interval))

    def _loop_sleep(self, interval: float) -> float:
        """Until the next loop turn: ``interval``, or less when a lease runs out
        sooner, so that the member is expired at its deadline, not up to an interval
        after it."""
        if not self._next_expiry:
            return interval
        now = self._estimated_now()
        upcoming = [d for _, d in self._next_expiry.values() if d >= now]
        if not upcoming:
            return interval  # a deadline already passed is the normal turn's business
        return max(0.005, min(interval, (min(upcoming) - now + 5) / 1000))

    def _loop_warning(self, message: str) -> None:
        """Log a loop problem at most once per 30 s (the loop runs every interval)."""
        now = time.monotonic()
        if now - self._loop_warned.get(message, -30.0) >= 30.0:
            if len(self._loop_warned) > 1000:
                self._loop_warned.clear()
            self._loop_warned[message] = now
            log.warning("loop: %s", message)

    async def tick_streams(self) -> None:
        """Advance stream migrations: check and retire drained shards (resharding)."""
        await self.resharder.tick()

    # -- streams ------------------------------------------------------------------------
    async def ensure_stream(self, name: str, shards: int) -> StreamInfo:
        """Create ``name`` with ``shards`` shards unless it exists (never rescales)."""
        _, meta = await self.store.load_stream(name)
        if meta is not None:
            if meta.shard_count != shards and meta.migration is None:
                log.warning(
                    "stream %s has %d shards; a declaration asked for %d (use `streams scale`)",
                    name,
                    meta.shard_count,
                    shards,
                )
            return self._stream_info(meta)
        return await self.create_stream(name, shards, exist_ok=True)

    async def create_stream(self, name: str, shards: int, *, exist_ok: bool = False) -> StreamInfo:
        async with self.critical(self.keyspace.stream_mutex(name)):
            rev, meta = await self.store.load_stream(name)
            if meta is not None:
                if exist_ok or meta.shard_count == shards:
                    return self._stream_info(meta)
                raise CoordinatorError(
                    "ALREADY_EXISTS",
                    f"stream {name!r} exists with {meta.shard_count} shards; "
                    "use `streams scale` to change it",
                    status=409,
                )
            leftovers = await self.store.existing_shard_keys(name)
            if leftovers and not await self._aborted_creation(name, shards, leftovers):
                raise self.store.unavailable(
                    f"stream {name!r} has shard keys in Redis ({len(leftovers)}) but no "
                    "metadata: it existed and its metadata was lost; an operator must "
                    "re-initialise it (streamworks admin reinit stream)"
                )
            now = await self.store.now_ms()
            meta = new_stream(name, shards, now)
            groups = sorted(await self.store.subscribed_groups(name))
            ids = [ShardId.parse(s) for s in meta.shard_ids()]
            await provision.create_shards(self.store.scripts, self.keyspace, ids, groups)
            if await self.store.commit_stream(rev, meta) is None:
                raise Conflict(f"stream {name!r} was created concurrently; retry")
            log.info("created stream %s with %d shards", name, shards)
            return self._stream_info(meta, created=True)

    async def _aborted_creation(self, name: str, shards: int, keys: list[str]) -> bool:
        """Whether shard keys found without metadata are what a creation of this very
        layout provisions before its commit, and never received an entry: a replica
        died between the two (E2), nothing of the stream ever existed. Any other
        leftover is evidence that the stream existed and its metadata was lost (E21)."""
        fresh = {self.keyspace.stream(ShardId(name, i, 0)) for i in range(shards)}
        if not set(keys) <= fresh:
            return False
        for key in keys:
            info = await self.redis.xinfo_stream(key)
            if int(info.get("entries-added", 1)) != 0:
                return False
        log.warning(
            "stream %s: %d shard keys left by a creation that did not commit; creating it",
            name,
            len(keys),
        )
        return True

    async def scale_stream(self, name: str, shards: int) -> StreamInfo:
        """Change a stream's shard count live (``resharding.py``)."""
        return self._stream_info(await self.resharder.scale(name, shards))

    async def routing(self, stream: str) -> RoutingResponse:
        namespace_id = await self.ensure_namespace()
        _, meta = await self.store.load_stream(stream)
        if meta is None:
            raise CoordinatorError("NOT_FOUND", f"stream {stream!r} does not exist", status=404)
        routable = meta.routable()
        return RoutingResponse(
            stream=stream,
            routing_version=meta.routing_version,
            protocol=meta.protocol,
            shard_count=len(routable),
            shards=[
                RoutingShard(
                    shard=s.shard_id(stream),
                    key=self.keyspace.stream(ShardId(stream, s.index, s.incarnation)),
                )
                for s in routable
            ],
            lease_ms=int(self.settings.routing_lease * 1000),
            namespace_id=namespace_id,
        )

    def _stream_info(self, meta: StreamMeta, *, created: bool = False) -> StreamInfo:
        migration: dict[str, object] | None = None
        if meta.migration is not None:
            migration = dict(meta.migration)
            migration.pop("created", None)
            migration["phase"] = migration_phase(meta, self._estimated_now()).value
            draining = set(migration.get("draining", []))  # type: ignore[call-overload]
            blocked = {s: r for s, r in self.resharder.blockers.items() if s in draining}
            if blocked:
                migration["blocked"] = blocked
        return StreamInfo(
            name=meta.name,
            shard_count=meta.shard_count,
            routing_version=meta.routing_version,
            protocol=meta.protocol,
            shards=[
                ShardInfo(shard=s.shard_id(meta.name), state=s.state.value)
                for s in meta.shards
                if s.state is not ShardState.RETIRED
            ],
            migration=migration,
            created=created,
        )

    async def stream_info(self, name: str) -> StreamInfo:
        _, meta = await self.store.load_stream(name)
        if meta is None:
            raise CoordinatorError("NOT_FOUND", f"stream {name!r} does not exist", status=404)
        return self._stream_info(meta)

    # -- groups and status --------------------------------------------------------------
    async def group_info(self, group_id: str) -> GroupInfo:
        loaded = await self.store.load_group(group_id)
        if loaded.group is None:
            raise CoordinatorError("NOT_FOUND", f"group {group_id!r} does not exist", status=404)
        leases = await self.store.lease_expiries(group_id)
        return _group_info(loaded.group, leases, loaded.now_ms)

    async def status(self, *, positions: bool = True) -> StatusResponse:
        """Streams and groups as recorded, with each group's ``pending``/``lag`` per shard
        (read with ``XINFO``; the coordinator never reads messages themselves, E24)."""
        streams = []
        for name in await self.store.registered_streams():
            try:
                info = await self.stream_info(name)
            except MetadataUnavailable as e:
                log.warning("status: %s", e)
                continue
            streams.append(await self._with_positions(info) if positions else info)
        groups = []
        for name in await self.store.registered_groups():
            try:
                groups.append(await self.group_info(name))
            except (MetadataUnavailable, CoordinatorError) as e:
                log.warning("status: %s", e)
        return StatusResponse(streams=streams, groups=groups)

    async def _with_positions(self, info: StreamInfo) -> StreamInfo:
        shards = [s for s in info.shards if s.state != "RETIRED"]
        if not shards:
            return info
        pipe = self.redis.pipeline(transaction=False)
        for shard in shards:
            key = self.keyspace.stream(ShardId.parse(shard.shard))
            pipe.xlen(key)
            pipe.xinfo_groups(key)
        replies = await pipe.execute(raise_on_error=False)
        out = []
        for shard in info.shards:
            if shard.state == "RETIRED":
                out.append(shard)
                continue
            j = shards.index(shard)
            length, groups = replies[2 * j], replies[2 * j + 1]
            if isinstance(length, Exception) or isinstance(groups, Exception):
                out.append(shard)
                continue
            out.append(
                shard.model_copy(
                    update={
                        "length": int(length),
                        "groups": [
                            ShardGroupInfo(
                                group=g["name"].decode(),
                                pending=int(g["pending"]),
                                lag=None if g["lag"] is None else int(g["lag"]),
                            )
                            for g in groups
                        ],
                    }
                )
            )
        return info.model_copy(update={"shards": out})

    # -- operator actions -------------------------------------------------------------
    async def unsubscribe(self, request: UnsubscribeRequest) -> StatusResponse:
        """A group stops consuming a stream for good: it leaves the stream's subscription
        registry and its consumer groups (positions, pending entries, fences, retry
        records) are removed from every shard. Refused while a live member of the
        group subscribes to the stream. Until this is done, a scale-in of the stream
        waits for the group to drain the removed shards."""
        group_id, stream = request.group, request.stream
        async with self.critical(self.keyspace.group_mutex(group_id)):
            loaded = await self.store.load_group(group_id)
            if loaded.group is not None:
                users = [
                    m.member_id
                    for m in loaded.group.members.values()
                    if m.is_live and stream in m.subscriptions
                ]
                if users:
                    raise CoordinatorError(
                        "IN_USE",
                        f"group {group_id!r} has {len(users)} live member(s) consuming "
                        f"{stream!r}; stop them (or remove the handler) first",
                        status=409,
                    )
            if group_id not in await self.store.subscribed_groups(stream):
                raise CoordinatorError(
                    "NOT_FOUND", f"group {group_id!r} is not subscribed to {stream!r}", status=404
                )
            _, meta = await self.store.load_stream(stream)
            shards = (
                []
                if meta is None
                else [ShardId.parse(s) for s in meta.shard_ids(meta.assignable())]
            )
            pipe = self.redis.pipeline(transaction=False)
            for shard in shards:
                pipe.execute_command("XGROUP", "DESTROY", self.keyspace.stream(shard), group_id)
                pipe.delete(
                    self.keyspace.fence(shard, group_id), self.keyspace.retries(shard, group_id)
                )
            await pipe.execute(raise_on_error=False)
            await self.redis.srem(self.keyspace.registry_subscriptions(stream), group_id)
            self._subscribed = {s for s in self._subscribed if s[:2] != (stream, group_id)}
            log.warning("operator unsubscribed group %s from stream %s", group_id, stream)
        return await self.status(positions=False)

    # -- operator recovery (E21) --------------------------------------------------------
    async def reinitialize(self, request: ReinitializeRequest) -> StatusResponse:
        """Re-create the metadata of one entity whose metadata was lost.

        Nothing is inferred from member reports, producer caches or the monitoring
        projection. For a stream, the operator states the shard count: fresh shards
        are created under a new incarnation, and every shard key of the stream still
        in Redis is adopted as DRAINING, so its entries are read to the end and it is
        retired by the normal drain check. For a group, the metadata starts empty with
        epochs above every epoch found in its owner fences; members rejoin.
        """
        if request.kind == "stream":
            if request.shards is None:
                raise CoordinatorError(
                    "INVALID_REQUEST", "re-initialising a stream needs its shard count", status=400
                )
            await self._reinitialize_stream(request.name, request.shards)
        else:
            await self._reinitialize_group(request.name)
        return await self.status(positions=False)

    async def _reinitialize_stream(self, name: str, shards: int) -> None:
        async with self.critical(self.keyspace.stream_mutex(name)):
            rev = await self.store.stream_revs([name])
            if rev[name]:
                raise CoordinatorError(
                    "ALREADY_EXISTS",
                    f"stream {name!r} has metadata; nothing to re-initialise",
                    status=409,
                )
            found = [
                ShardId.parse(k[k.index(":") + 1 : k.index("}")])
                for k in await self.store.existing_shard_keys(name)
            ]
            first = max((s.incarnation for s in found), default=-1) + 1
            now = await self.store.now_ms()
            meta = new_stream(name, shards, now, first_incarnation=first)
            adopted = [ShardRecord(s.index, s.incarnation, ShardState.DRAINING) for s in found]
            meta = meta.with_shards(
                [*meta.shards, *adopted], routing_version=now, layout_version=now
            )
            groups = sorted(await self.store.subscribed_groups(name))
            ids = [ShardId.parse(s) for s in meta.shard_ids(meta.routable())]
            await provision.create_shards(self.store.scripts, self.keyspace, ids, groups)
            if await self.store.commit_stream(0, meta) is None:
                raise Conflict(f"stream {name!r} was written concurrently; retry")
            log.warning(
                "operator re-initialised stream %s: %d new shards, %d old shard keys draining",
                name,
                shards,
                len(adopted),
            )

    async def _reinitialize_group(self, group_id: str) -> None:
        async with self.critical(self.keyspace.group_mutex(group_id)):
            if (await self.redis.hget(self.keyspace.group_meta(group_id), "rev")) is not None:
                # Present (maybe corrupt): the operator deletes it first, deliberately.
                raw = await self.redis.hget(self.keyspace.group_meta(group_id), "header")
                if raw is not None:
                    raise CoordinatorError(
                        "ALREADY_EXISTS",
                        f"group {group_id!r} has metadata; delete the key first if it is corrupt",
                        status=409,
                    )
            floor = await self.store.highest_fence_epoch(group_id)
            now = await self.store.now_ms()
            group = empty_group(group_id, floor)
            await self.redis.delete(self.keyspace.group_meta(group_id))
            if (
                await self.store.commit_group(
                    0,
                    group,
                    now_ms=now,
                    header_changed=True,
                    changed=(),
                    removed=(),
                    lease_ttl_ms=self.config.lease_ttl_ms,
                )
                is None
            ):
                raise Conflict(f"group {group_id!r} was written concurrently; retry")
            log.warning(
                "operator re-initialised group %s: epochs restart above %d", group_id, floor
            )


def _group_info(group: Group, leases: Mapping[str, int], now_ms: int) -> GroupInfo:
    return GroupInfo(
        group=group.group_id,
        state=group.state.value,
        group_epoch=group.group_epoch,
        target_epoch=group.target_epoch,
        metadata_version=group.metadata_version,
        subscriptions=sorted(_subscriptions(group.members.values())),
        members=[_member_info(m, leases.get(m.member_id), now_ms) for m in group.members.values()],
    )


def _subscriptions(members: Iterable[Member]) -> set[str]:
    out: set[str] = set()
    for member in members:
        if member.is_live:
            out |= member.subscriptions
    return out


def _member_info(member: Member, lease: int | None, now_ms: int) -> MemberInfo:
    return MemberInfo(
        member_id=member.member_id,
        epoch=member.epoch,
        state=member.state.value,
        assigned=sorted(member.assigned),
        pending_revocation=sorted(member.pending_revocation),
        target=sorted(member.target),
        lease_expires_in_ms=lease - now_ms if lease is not None else None,
        client=dict(member.client),
    )

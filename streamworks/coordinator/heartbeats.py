"""Member heartbeats: the shell around the core's ``heartbeat`` step (PROTOCOL §4).

A heartbeat that changes nothing takes a short road: the core decides on the cached
group, and ``lease_renew.lua`` renews the lease in one round trip only if the cached
revisions are still current. Otherwise the full critical section runs: load, decide,
commit with a compare-and-set, provision consumer groups before any grant, write
the owner fences of new grants, answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from streamworks.coordinator.core import (
    CoreConfig,
    Group,
    HeartbeatInput,
    HeartbeatResult,
    InvalidHeartbeat,
    heartbeat,
)
from streamworks.coordinator.core.model import FenceWrite
from streamworks.coordinator.core.recovery import fence_after_regression
from streamworks.coordinator.core.streams import StreamMeta
from streamworks.coordinator.discipline import WriteDiscipline
from streamworks.coordinator.metrics import CoordinatorMetrics
from streamworks.coordinator.replica import ReplicaState, live_subscriptions
from streamworks.coordinator.store import Conflict, MetadataUnavailable, Store
from streamworks.coordinator.subscriptions import Subscriptions
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.control import (
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatStatus,
    ShardGrant,
    StartPosition,
)
from streamworks.redis.keyspace import Keyspace

__all__ = ("HeartbeatHandler",)

log = logging.getLogger("streamworks.coordinator")

#: How long after another member's lease deadline a member is asked to heartbeat, so
#: that the loop (which wakes at the deadline) has expired it and moved its shards.
_AFTER_EXPIRY_MS = 100


class HeartbeatHandler:
    """Answers the heartbeats of every group on one replica."""

    def __init__(
        self,
        *,
        store: Store,
        keyspace: Keyspace,
        config: CoreConfig,
        cas_retries: int,
        metrics: CoordinatorMetrics,
        discipline: WriteDiscipline,
        replica: ReplicaState,
        subscriptions: Subscriptions,
    ) -> None:
        self.store = store
        self.keyspace = keyspace
        self.config = config
        self.cas_retries = cas_retries
        self.metrics = metrics
        self.discipline = discipline
        self.replica = replica
        self.subscriptions = subscriptions

    async def handle(self, group_id: str, body: HeartbeatRequest) -> HeartbeatResponse:
        """Answer one heartbeat of ``group_id``.

        Raises:
            CoordinatorError: ``INVALID_REQUEST`` for a request the core refuses,
                ``METADATA_UNAVAILABLE`` (fail closed, E21), ``CONFLICT`` and
                ``COORDINATOR_TERMINATING`` (retryable).
        """
        started = time.perf_counter()
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
            response = await self._fast(group_id, request)
            path = "fast"
            if response is None:
                path = "full"
                response = await self._full(group_id, request, body.subscription_starts or {})
        except InvalidHeartbeat as e:
            raise CoordinatorError("INVALID_REQUEST", str(e), status=400) from e
        except MetadataUnavailable:
            self.metrics.unavailable.inc()
            raise
        self.metrics.heartbeats.labels(path, response.status.value).inc()
        self.metrics.heartbeat_seconds.observe(time.perf_counter() - started)
        return response

    async def _fast(self, group_id: str, request: HeartbeatInput) -> HeartbeatResponse | None:
        """The no-change answer from cached state, or None when the full road is needed."""
        if request.member_epoch <= 0 or self.discipline.terminating:
            return None
        cached = self.store.cached_group(group_id)
        if cached is None:
            return None
        rev, group = cached
        member = group.members.get(request.member_id)
        if member is None or not member.is_live:
            return None
        streams = self.replica.group_streams(group_id, rev, group)
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
        topology = self.replica.topology_of(stream_revs, metas)
        result = heartbeat(group, topology, request, self.replica.estimated_now(), self.config)
        if not result.is_noop or result.status is not HeartbeatStatus.OK:
            return None
        renewed, now_ms = await self.store.renew_lease(
            group_id, request.member_id, self.config.lease_ttl_ms, rev, stream_revs
        )
        self.replica.saw_redis_time(now_ms)
        if not renewed:
            return None
        return self._response(result, request.member_id, group_id)

    async def _full(
        self, group_id: str, request: HeartbeatInput, starts: Mapping[str, StartPosition]
    ) -> HeartbeatResponse:
        async with self.discipline.critical(self.keyspace.group_mutex(group_id)):
            for _ in range(self.cas_retries):
                loaded = await self.store.load_group(group_id)
                self.replica.saw_redis_time(loaded.now_ms)
                group = loaded.group
                if group is None:
                    if request.member_epoch != 0:
                        group = Group(group_id)  # unknown group: the core answers UNKNOWN_MEMBER
                    else:
                        group = await self._new_group(group_id, request.subscriptions or ())
                names = set(self.replica.group_streams(group_id, loaded.rev, group))
                names |= request.subscriptions or frozenset()
                loaded_streams = await self.store.load_streams(names)
                metas = {n: m for n, (_, m) in loaded_streams.items() if m is not None}
                revs = {n: r for n, (r, _) in loaded_streams.items()}
                topology = self.replica.topology_of(revs, metas)
                result = heartbeat(group, topology, request, loaded.now_ms, self.config)
                if not loaded.rev and result.status is HeartbeatStatus.UNKNOWN_MEMBER:
                    # A group that does not exist: nothing to write, and in particular no
                    # group created from what an unknown member reports (E20).
                    return self._response(result, request.member_id, group_id)
                # Consumer groups are provisioned (and the subscription registered, the
                # evidence E21 relies on) only for a group that exists in Redis or is
                # committed now, never for a request that fails validation or a refusal.
                wanted = (
                    live_subscriptions(result.group.members.values())
                    if result.changed_members
                    else self.replica.group_streams(group_id, loaded.rev, group)
                )
                # Streams that do not exist yet are included: the subscription is
                # recorded, so the stream is created with this group's consumer groups.
                subscribed = {n: loaded_streams[n] for n in wanted if n in loaded_streams}
                if result.is_noop and loaded.rev:
                    await self.subscriptions.ensure(group_id, subscribed, starts)
                    if not result.renews_lease:
                        return self._response(result, request.member_id, group_id)
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
                await self.subscriptions.ensure(group_id, subscribed, starts)  # before any grant
                if result.group.target_epoch != group.target_epoch:
                    self.metrics.rebalances.labels(group_id).inc()
                self.metrics.observe_group(
                    group_id,
                    group_epoch=result.group.group_epoch,
                    live_members=len(result.group.live_members()),
                )
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
        refused: list[tuple[FenceWrite, str]],
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
            namespace_id=self.replica.namespace_id,
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

    def _response(
        self, result: HeartbeatResult, member_id: str, group_id: str
    ) -> HeartbeatResponse:
        interval = result.heartbeat_interval_ms
        soon = self.replica.next_expiry.get(group_id)
        if soon is not None and soon[0] != member_id:
            # Another member's lease runs out before this member's next heartbeat (it
            # stopped heartbeating): come back just after the loop expires it, to pick
            # up its shards then rather than up to a whole interval later. Failover
            # takes the lease TTL, not TTL + interval.
            until = soon[1] - self.replica.estimated_now() + _AFTER_EXPIRY_MS
            if 0 < until < interval:
                interval = until
        return HeartbeatResponse(
            status=result.status,
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
            namespace_id=self.replica.namespace_id,
        )

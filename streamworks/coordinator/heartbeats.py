"""Member heartbeats: the shell around the core's ``heartbeat`` step (docs/protocol.md#heartbeat).

A heartbeat that changes nothing takes a short road: the core decides on the cached
group, and ``lease_renew.lua`` renews the lease in one round trip only if the cached
revisions are still current. Otherwise the full critical section runs: load, decide,
commit with a compare-and-set, provision consumer groups before any grant, write
the owner fences of new grants, answer.

A request numbered at or below the newest sequence number acted on for its member
(the store records it with every commit and every renewal, in the same script) is
stale: it acts on nothing, on either road, and is refused with the retryable
``STALE_REQUEST`` (not answered from the record: the record may hold writes the
replicas have not acknowledged; the member sends a new request). Every write an
answer depends on waits for the Redis replicas first (``replication.py``); one they
did not acknowledge in time is not answered (``NOT_REPLICATED``, retryable). While the
replica's clock-step detector holds (``core/clock_steps.py``), nothing is granted.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import anyio

from streamworks.coordinator.batching import DEFAULT_MAX_BATCH, Combiner
from streamworks.coordinator.core import (
    CoreConfig,
    Group,
    GroupChange,
    HeartbeatInput,
    HeartbeatResult,
    InvalidHeartbeat,
    Topology,
    heartbeat,
)
from streamworks.coordinator.core.changes import chain
from streamworks.coordinator.core.model import FenceWrite
from streamworks.coordinator.core.recovery import fence_after_regression
from streamworks.coordinator.core.streams import StreamMeta
from streamworks.coordinator.core.targets import assignment_due
from streamworks.coordinator.core.tokens import parse_token
from streamworks.coordinator.discipline import WriteDiscipline
from streamworks.coordinator.leases import RENEWED, STALE
from streamworks.coordinator.metrics import CoordinatorMetrics
from streamworks.coordinator.replica import ReplicaState
from streamworks.coordinator.replication import NotReplicated, WaitLog
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

__all__ = ("HeartbeatHandler", "short_road_budget")

log = logging.getLogger("streamworks.coordinator")

#: How long after another member's lease deadline a member is asked to heartbeat, so
#: that the loop (which wakes at the deadline) has expired it and moved its shards.
_AFTER_EXPIRY_MS = 100


@dataclass(frozen=True, slots=True)
class _Decided:
    """The steps of a batch: each request's outcome where it is decided without a
    write, the kept steps (answered after the writes) and what the commit writes."""

    outcomes: list[HeartbeatResponse | Exception | None]
    kept: list[tuple[int, HeartbeatResult]]
    steps: list[HeartbeatResult]
    #: member -> the sequence number of its request the batch acts on (recorded with
    #: the commit or the lease renewal).
    sequences: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Beat:
    """A heartbeat waiting for the full road."""

    request: HeartbeatInput
    starts: Mapping[str, StartPosition]


def stale_request(member_id: str, sequence: int | None) -> CoordinatorError:
    """The answer to a request the coordinator acted on already, or a newer one of its
    member (retryable: the member sends a new request, which is answered in full)."""
    return CoordinatorError(
        "STALE_REQUEST",
        f"member {member_id}: request {sequence} was acted on already (or a newer one); "
        "send a new request",
        retryable=True,
        status=409,
    )


def short_road_budget(pool: int | None) -> int | None:
    """How many of a pool's ``pool`` Redis connections the no-change heartbeats may hold
    at once: three quarters; the last quarter (at least one) is kept for critical
    sections, the loop and status reads. None (no bound) when the pool size is unknown."""
    if pool is None:
        return None
    return max(1, pool - max(1, pool // 4))


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
        max_batch: int = DEFAULT_MAX_BATCH,
        short_road_connections: int | None = None,
    ) -> None:
        self.store = store
        self.keyspace = keyspace
        self.config = config
        self.cas_retries = cas_retries
        self.metrics = metrics
        self.discipline = discipline
        self.replica = replica
        self.subscriptions = subscriptions
        # The no-change heartbeats may hold this many Redis connections at once, the
        # rest of the pool stays free for critical sections and the loop: under a burst
        # far above capacity the short road queues here, not in the pool in front of a
        # critical section (which could then outlive its mutex TTL).
        self._short_road: anyio.Semaphore | contextlib.nullcontext[None] = (
            anyio.Semaphore(short_road_connections)
            if short_road_connections
            else contextlib.nullcontext()
        )
        #: Heartbeats queued behind a group's critical section are decided together.
        self.batches: Combiner[_Beat, HeartbeatResponse] = Combiner(
            discipline, self._batch, max_batch=max_batch, on_batch=metrics.heartbeat_batch.observe
        )

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
            sequence=body.sequence,
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
        except NotReplicated:
            self.metrics.not_replicated.inc()
            raise
        self.metrics.heartbeats.labels(path, response.status.value).inc()
        self.metrics.heartbeat_seconds.observe(time.perf_counter() - started)
        return response

    async def _fast(self, group_id: str, request: HeartbeatInput) -> HeartbeatResponse | None:
        """The no-change answer from cached state, or None when the full road is needed.

        When another replica committed since this one cached the group, the cache is
        brought up to date without the mutex (a read of only what changed, see
        ``Store.load_group``) and the decision is taken once more: a fleet spread over
        several replicas stays on the short road although each commit moves the
        revision every replica cached.
        """
        if request.member_epoch <= 0 or self.discipline.terminating:
            return None
        cached = self.store.cached_group(group_id)
        if cached is None:
            return None
        async with self._short_road:
            answer, stale = await self._fast_on(group_id, request, *cached)
            if not stale:
                return answer
            loaded = await self.store.load_group(group_id)
            if loaded.group is None or loaded.rev == cached[0]:
                return None
            answer, _ = await self._fast_on(group_id, request, loaded.rev, loaded.group)
            return answer

    async def _fast_on(
        self, group_id: str, request: HeartbeatInput, rev: int, group: Group
    ) -> tuple[HeartbeatResponse | None, bool]:
        """The no-change answer decided on ``group`` at ``rev``, and whether the lease
        was refused because a revision moved (or the lease entry is gone)."""
        member = group.members.get(request.member_id)
        if member is None or not member.is_live:
            return None, False
        streams = group.live_subscriptions()
        if request.subscriptions is not None and not request.subscriptions <= streams:
            return None, False
        metas: dict[str, StreamMeta] = {}
        stream_revs: dict[str, int] = {}
        for name in streams:
            entry = self.store.cached_stream(name)
            if entry is None:
                return None, False
            stream_revs[name], metas[name] = entry
        # Decide on the cached state with an estimate of Redis time; only a decision
        # that changes nothing is used, and only if the revisions are still current.
        now = self.replica.estimated_now()
        if assignment_due(group, now, self.config):
            # The step would compute a target (a change): with 1,000 members that is
            # milliseconds of assignor per heartbeat, repeated by every heartbeat until
            # one commits it, for a decision the short road cannot use.
            return None, False
        topology = self.replica.topology_of(stream_revs, metas)
        hold = self.replica.holding_grants()
        result = heartbeat(group, topology, request, now, self.config, hold_grants=hold)
        if not result.is_noop or result.status is not HeartbeatStatus.OK:
            return None, False
        status, now_ms = await self.store.renew_lease(
            group_id,
            request.member_id,
            self.config.lease_ttl_ms,
            rev,
            stream_revs,
            request.sequence,
        )
        self.replica.saw_redis_time(now_ms)
        if status == STALE:
            # Acted on already (a duplicate, a re-send, a delayed copy): nothing was
            # renewed, and nothing is answered (the record may hold writes the replicas
            # have not acknowledged; the member sends a new request).
            self.metrics.stale_heartbeats.inc()
            raise stale_request(request.member_id, request.sequence)
        if status != RENEWED:
            return None, True
        return self._response(result, request.member_id, group_id), False

    async def _full(
        self, group_id: str, request: HeartbeatInput, starts: Mapping[str, StartPosition]
    ) -> HeartbeatResponse:
        return await self.batches.submit(
            group_id, self.keyspace.group_mutex(group_id), _Beat(request, starts)
        )

    async def _batch(
        self, group_id: str, beats: Sequence[_Beat]
    ) -> list[HeartbeatResponse | Exception]:
        """The heartbeats of ``group_id`` queued behind one critical section, inside it:
        one load, the core's step for each request in turn on the previous one's
        result, one commit of the merged change set, one fence pipeline. A lost
        compare-and-set retries the whole batch (bounded, then ``CONFLICT`` for all)."""
        for _ in range(self.cas_retries):
            outcomes = await self._attempt(group_id, beats)
            if outcomes is not None:
                return outcomes
            self.metrics.conflicts.inc()
        conflict = Conflict(f"group {group_id!r}: lost the compare-and-set repeatedly; retry")
        return [conflict] * len(beats)

    async def _attempt(
        self, group_id: str, beats: Sequence[_Beat]
    ) -> list[HeartbeatResponse | Exception] | None:
        """One try of :meth:`_batch`; None when the compare-and-set was lost."""
        loaded = await self.store.load_group(group_id)
        self.replica.saw_redis_time(loaded.now_ms)
        base = loaded.group if loaded.group is not None else Group(group_id)
        numbered = [b.request.member_id for b in beats if b.request.sequence is not None]
        last = await self.store.sequences_of(group_id, list(dict.fromkeys(numbered)))
        names = set(base.live_subscriptions())
        for beat in beats:
            names |= beat.request.subscriptions or frozenset()
        loaded_streams = await self.store.load_streams(names)
        metas = {n: m for n, (_, m) in loaded_streams.items() if m is not None}
        revs = {n: r for n, (r, _) in loaded_streams.items()}
        topology = self.replica.topology_of(revs, metas)

        decided = await self._decide(
            group_id, beats, base, bool(loaded.rev), topology, loaded.now_ms, last
        )
        outcomes, kept, steps = decided.outcomes, decided.kept, decided.steps

        # Consumer groups are provisioned (and the subscription registered, the evidence
        # E21 relies on) only for a group that exists in Redis or is committed now, never
        # for a request that fails validation or a refusal; for every state a step
        # commits, as each would have been had the steps committed one by one. Streams
        # that do not exist yet are included: the subscription is recorded, so the
        # stream is created with this group's consumer groups.
        wanted = (
            set(base.live_subscriptions()) if not any(s.changed_members for s in steps) else set()
        )
        for step in steps:
            if step.changed_members:
                wanted |= step.group.live_subscriptions()
        subscribed = {n: loaded_streams[n] for n in wanted if n in loaded_streams}
        starts: dict[str, StartPosition] = {}
        for i, _ in kept:
            for stream, start in beats[i].starts.items():
                starts.setdefault(stream, start)  # the first to subscribe chooses
        renewing = [beats[i].request.member_id for i, r in kept if r.renews_lease]
        sequences = dict(decided.sequences)
        waits = self.store.waits.log()

        if not steps:
            # Nothing to write: renew the leases of the no-change heartbeats (checked
            # by revision and sequence, as on the short road). A lease entry that ran
            # out before the loop expired its member takes a commit: the member is
            # still live in the metadata, so renewing is what a heartbeat in time
            # would have done.
            if loaded.rev:
                await self.subscriptions.ensure(group_id, subscribed, starts)
            renewing = list(dict.fromkeys(renewing))
            statuses = await self.store.renew_leases(
                group_id,
                [(m, sequences.get(m)) for m in renewing],
                self.config.lease_ttl_ms,
                loaded.rev,
                revs,
            )
            if STALE in statuses:
                return None  # a newer request acted since the load: decide again
            renew = [m for m, st in zip(renewing, statuses, strict=True) if st != RENEWED]
            if not renew:
                return self._answers(group_id, beats, outcomes, kept, {})
            sequences = {m: n for m, n in sequences.items() if m in renew}
        else:
            renew = list(dict.fromkeys(renewing))
        change = chain(base, steps)
        final = change.group
        renew = [m for m in renew if (rec := final.members.get(m)) is not None and rec.is_live]
        new_rev = await self.store.commit_group(
            loaded.rev,
            final,
            now_ms=loaded.now_ms,
            header_changed=change.header_changed,
            changed=change.changed_members,
            removed=change.removed_members,
            renew=renew,
            sequences=sequences,
            lease_ttl_ms=self.config.lease_ttl_ms,
            waits=waits,
        )
        if new_rev is None:
            return None
        await self.subscriptions.ensure(group_id, subscribed, starts)  # before any grant
        previous = base
        for step in steps:
            if step.group.target_epoch != previous.target_epoch:
                self.metrics.rebalances.labels(group_id).inc()
            previous = step.group
        self.metrics.observe_group(
            group_id, group_epoch=final.group_epoch, live_members=final.live_count()
        )
        refused = await self.store.write_fences(
            group_id, change.fences, known_token=base.last_token, waits=waits
        )
        fenced = {}
        if refused:
            fenced = await self._after_refused_fences(group_id, new_rev, final, refused, waits)
        # Answer only what the replicas have (a node's last WAIT covers its earlier
        # writes): a grant, fence or lease they did not acknowledge is not done.
        waits.check(f"heartbeats of group {group_id!r}")
        return self._answers(group_id, beats, outcomes, kept, fenced)

    async def _decide(
        self,
        group_id: str,
        beats: Sequence[_Beat],
        base: Group,
        exists: bool,
        topology: Topology,
        now_ms: int,
        last_sequences: Mapping[str, int],
    ) -> _Decided:
        """The core's step for each request in turn, each on the previous kept step's
        group (``exists``: the group is in Redis; ``last_sequences``: the newest
        sequence number acted on per member, as stored)."""
        decided = _Decided([None] * len(beats), [], [])
        last = dict(last_sequences)
        hold = self.replica.holding_grants()
        group = base
        for i, beat in enumerate(beats):
            request = replace(beat.request, last_sequence=last.get(beat.request.member_id, 0))
            try:
                if request.member_epoch == 0 and not exists:
                    await self._check_new_group(group_id, request.subscriptions or ())
                result = heartbeat(group, topology, request, now_ms, self.config, hold_grants=hold)
            except (InvalidHeartbeat, MetadataUnavailable) as e:
                decided.outcomes[i] = e  # this request only; the batch goes on without it
                continue
            if result.stale:
                self.metrics.stale_heartbeats.inc()
                decided.outcomes[i] = stale_request(request.member_id, request.sequence)
                continue
            if request.sequence is not None and (result.renews_lease or not result.is_noop):
                # Acted on: recorded with the commit or the renewal; a later copy of
                # the same request in this batch is stale.
                last[request.member_id] = decided.sequences[request.member_id] = request.sequence
            if not exists and result.status is HeartbeatStatus.UNKNOWN_MEMBER:
                # A group that does not exist: nothing to write, and in particular no
                # group created from what an unknown member reports (E20).
                decided.outcomes[i] = self._response(result, request.member_id, group_id)
                continue
            if result.is_noop and not result.renews_lease:
                decided.outcomes[i] = self._response(result, request.member_id, group_id)
                continue
            decided.kept.append((i, result))
            if not result.is_noop:
                decided.steps.append(result)
                group = result.group
                exists = True  # created by this step, if it was not
        return decided

    def _answers(
        self,
        group_id: str,
        beats: Sequence[_Beat],
        outcomes: list[HeartbeatResponse | Exception | None],
        kept: Sequence[tuple[int, HeartbeatResult]],
        fenced: Mapping[str, HeartbeatResponse],
    ) -> list[HeartbeatResponse | Exception]:
        """Every request's outcome: the answers decided on the way, then each kept
        step's own answer (FENCED for a member whose grant a fence refused)."""
        for i, result in kept:
            member_id = beats[i].request.member_id
            answer = fenced.get(member_id)
            outcomes[i] = answer or self._response(result, member_id, group_id)
        answers = [o for o in outcomes if o is not None]
        assert len(answers) == len(outcomes)  # every request answered or refused
        return answers

    async def _after_refused_fences(
        self,
        group_id: str,
        rev: int,
        group: Group,
        refused: list[tuple[FenceWrite, str]],
        waits: WaitLog,
    ) -> dict[str, HeartbeatResponse]:
        """Fences hold grants the metadata never recorded: Redis lost group writes
        (E19), and those grants' owners may still run the shards. Fence each member
        concerned with its shards quarantined for as long as any lease may cover them,
        and raise the token floor above the fences (one commit); they rejoin and
        receive grants under tokens no fence has seen. Returns each fenced member's
        answer."""
        by_member: dict[str, dict[str, str]] = {}
        for fence, found in refused:
            by_member.setdefault(fence.member_id, {})[fence.shard] = found
        highest = max(parse_token(found) or 0 for _, found in refused)
        log.warning(
            "group %s: owner fence(s) hold grants the metadata never recorded (highest "
            "token %d): metadata lost writes; fencing member(s) %s, their shards and "
            "the lost grants' quarantined, the token floor raised",
            group_id,
            highest,
            ", ".join(sorted(by_member)),
        )
        self.metrics.regressions.labels(group_id).inc()
        now = await self.store.now_ms()
        leases = await self.store.lease_expiries(group_id)
        ttl = self.config.lease_ttl_ms
        steps: list[GroupChange] = []
        current = group
        for member_id, shards in by_member.items():
            step = fence_after_regression(
                current,
                member_id,
                shards,
                now,
                member_until_ms=max(leases.get(member_id, 0), now + ttl),
                # The lost grants' leases are recorded nowhere: their owners may run
                # the shards for up to a lease TTL after their last heartbeat (< now).
                lost_until_ms=now + ttl,
            )
            steps.append(step)
            current = step.group
        change = chain(group, steps)
        await self.store.commit_group(
            rev,
            change.group,
            now_ms=now,
            header_changed=change.header_changed,
            changed=change.changed_members,
            removed=change.removed_members,
            lease_ttl_ms=self.config.lease_ttl_ms,
            waits=waits,
        )
        return {
            member_id: HeartbeatResponse(
                status=HeartbeatStatus.FENCED,
                member_id=member_id,
                member_epoch=0,
                group_epoch=change.group.group_epoch,
                metadata_version=change.group.metadata_version,
                heartbeat_interval_ms=self.config.heartbeat_interval_ms,
                lease_ttl_ms=self.config.lease_ttl_ms,
                key_prefix=self.keyspace.prefix,
                namespace_id=self.replica.namespace_id,
            )
            for member_id in by_member
        }

    async def _check_new_group(self, group_id: str, subscriptions: Iterable[str]) -> None:
        """A group joining for the first time. If Redis shows it existed (its consumer
        group is registered on a stream it subscribes to) while its metadata and
        registry entry are gone: fail closed (E21).

        Raises:
            MetadataUnavailable: it existed.
        """
        for stream in subscriptions:
            if group_id in await self.store.subscribed_groups(stream):
                raise self.store.unavailable(
                    f"group {group_id!r} has consumer groups on stream {stream!r} but no "
                    "metadata: it existed and its metadata was lost; an operator must "
                    "re-initialise it (streamworks admin reinit group)"
                )

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

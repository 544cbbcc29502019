"""Group-level properties: a stateful model of members, clients, clocks and topology.

A hypothesis ``RuleBasedStateMachine`` drives the pure core the way the shell
and real members would: honest clients join, heartbeat (sometimes losing the
response, then re-sending their old epoch), drain revoked shards over a few
heartbeats, leave or crash; the network delivers a request twice or late (the same
body, the same sequence number, after the member moved on); the clock advances; the
Redis clock steps (grants held); the event loop expires leases, fences overdue
revocations, removes stale records and computes batched targets; streams gain and
lose shards. The protocol invariants are checked after every step.

Also here: the model's serialization and validation properties.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from streamworks.coordinator.core import (
    CoreConfig,
    Group,
    GroupChange,
    GroupState,
    HeartbeatInput,
    HeartbeatResult,
    HeartbeatStatus,
    Member,
    MemberState,
    Topology,
    compute_target_if_due,
    expire_members,
    fence_overdue_revocations,
    heartbeat,
    release_quarantines,
    remove_stale_members,
    stream_of,
)
from streamworks.coordinator.core.changes import GroupEdit, apply_delta
from streamworks.coordinator.core.recovery import fence_after_regression
from streamworks.exceptions import ConfigurationError

MEMBER_IDS = ("m0", "m1", "m2", "m3", "m4")
STREAMS = ("a", "b")
#: Heartbeats a client needs to drain a revoked shard; 50 is a handler that hangs
#: until the revocation deadline fences it.
DRAIN_HEARTBEATS = st.sampled_from([0, 1, 1, 2, 3, 50])


@dataclass
class Client:
    """What an honest member process believes."""

    alive: bool = False
    epoch: int = 0
    metadata_version: int = 0
    subscriptions: frozenset[str] = frozenset(STREAMS)
    send_subscriptions: bool = False
    owned: set[str] = field(default_factory=set)
    grants: dict[str, int] = field(default_factory=dict)  # owned shard -> fence token
    revoking: dict[str, int] = field(default_factory=dict)  # shard -> heartbeats left
    sequence: int = 0  # of the last request sent (the process never reuses one)
    sent: list[HeartbeatInput] = field(default_factory=list)  # the last few requests
    highest: dict[str, int] = field(default_factory=dict)  # shard -> highest token seen

    def drop_everything(self) -> None:
        self.epoch = 0
        self.owned.clear()
        self.grants.clear()
        self.revoking.clear()


class GroupMachine(RuleBasedStateMachine):
    """Homogeneous subscriptions, targets computed on every change."""

    config = CoreConfig(
        lease_ttl_ms=10_000,
        rebalance_timeout_ms=30_000,
        heartbeat_interval_ms=1_000,
        stale_member_retention_ms=60_000,
        assignment_interval_ms=0,
    )
    heterogeneous = False

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000_000
        self.shard_counts = {"a": 4, "b": 3}
        self.incarnation = 0
        self.topology_version = 1
        self.topology = self._build_topology()
        self.group = Group("g")
        self.refused: dict[str, int] = {}
        self.clients = {mid: Client() for mid in MEMBER_IDS}
        self.leases: dict[str, int] = {}
        # The newest request sequence acted on, per member (the shell's store).
        self.sequences: dict[str, int] = {}
        # Owner fences live on the shards' keys: a loss of metadata writes keeps them.
        self.fences: dict[str, tuple[str, int]] = {}
        self.converged_checks = 0
        self.history: list[tuple[Group, dict[str, int], dict[str, int]]] = []
        self.lost_writes = False
        self.hold_grants = False

    # -- the world ---------------------------------------------------------------

    def _build_topology(self) -> Topology:
        return Topology(
            shards={
                s: tuple(f"{s}/{i}@{self.incarnation}" for i in range(n))
                for s, n in self.shard_counts.items()
            },
            versions=dict.fromkeys(self.shard_counts, self.topology_version),
        )

    def _apply(
        self,
        result: GroupChange,
        *,
        actor: str | None = None,
        reported: frozenset[str] | None = None,
        replaced: bool = False,
    ) -> dict[str, int]:
        """Commit a step like the shell would, checking the step-wise invariants.
        Returns the members whose grant a fence refused (they are answered FENCED)."""
        before, after = self.group, result.group
        # The change set is exact: the shell writes only that, and a no-op nothing.
        assert result.header_changed == (before.to_header() != after.to_header())
        differing = {
            mid
            for mid in set(before.members) | set(after.members)
            if before.members.get(mid) != after.members.get(mid)
        }
        assert result.changed_members == differing
        assert result.removed_members == set(before.members) - set(after.members)
        # Invariant 2: group and target epochs never decrease.
        assert after.group_epoch >= before.group_epoch
        assert after.target_epoch >= before.target_epoch
        for mid, new in after.members.items():
            old = before.members.get(mid)
            if old is None or (replaced and mid == actor):
                continue  # a new incarnation of the member starts over
            # Invariant 2: a member's epoch never decreases.
            assert new.epoch >= old.epoch, f"{mid} epoch went back"
            if new.epoch != old.epoch:
                # Only the heartbeating member's epoch moves, never in timer steps...
                assert mid == actor, f"{mid}'s epoch moved in someone else's step"
                # ...and (invariant 3) never while it still holds shards to revoke.
                if old.state is MemberState.UNREVOKED:
                    assert reported is not None
                    assert reported.isdisjoint(old.pending_revocation)
        # Invariant 4: per shard, fence tokens strictly increase with every grant, so
        # fence.lua never has to refuse a write. Only after Redis lost metadata writes
        # may it refuse one (a fence holds a token the metadata never recorded): the
        # shell then fences the member and raises the token floor above that token.
        refused: dict[str, dict[str, str]] = {}
        for fence in result.fences:
            last = self.fences.get(fence.shard)
            token = (fence.member_id, fence.token)
            verdict = _fence_script(last, token, before.last_token)
            if verdict == "refused":
                assert self.lost_writes, f"fence of {fence.shard}: {token} after {last}"
                assert last is not None
                refused.setdefault(fence.member_id, {})[fence.shard] = f"{last[1]}:{last[0]}"
            elif verdict == "written":
                self.fences[fence.shard] = token
        assert all(f.token <= after.last_token for f in result.fences)
        assert after.last_token >= before.last_token
        self.history = [*self.history[-9:], (before, dict(self.leases), dict(self.sequences))]
        _check_derived(after)
        # What another replica reads after this commit (the changed records and, if it
        # changed, the header), applied to what it had: exactly the committed group.
        caught_up = apply_delta(
            before,
            after.to_header() if result.header_changed else None,
            [after.members[m] for m in result.changed_members if m in after.members],
            result.removed_members,
        )
        assert caught_up == after
        _check_derived(caught_up)
        self.group = after
        for mid in result.removed_members:
            self.sequences.pop(mid, None)  # deleted with the record, in the same script
        for mid, shards in refused.items():
            # As the shell does: fenced, its shards quarantined for a whole lease TTL,
            # the lost grants' shards too (under their owners' records).
            ttl_end = self.now + self.config.lease_ttl_ms
            step = fence_after_regression(
                self.group,
                mid,
                shards,
                self.now,
                member_until_ms=max(self.leases.get(mid, 0), ttl_end),
                lost_until_ms=ttl_end,
            )
            self._apply(step)
            for shard, fence in shards.items():
                assert self.group.last_token >= int(fence.split(":")[0])
                assert self.group.holders().get(shard) is not None  # quarantined
            self.leases.pop(mid, None)
        return dict.fromkeys(refused, 1)

    def _heartbeat(self, mid: str, *, lose: bool, drain: int) -> HeartbeatResult | None:
        client = self.clients[mid]
        if not client.alive:
            return None
        for shard in list(client.revoking):
            client.revoking[shard] -= 1
            if client.revoking[shard] <= 0:
                del client.revoking[shard]
        joining = client.epoch == 0
        client.sequence += 1
        request = HeartbeatInput(
            member_id=mid,
            member_epoch=client.epoch,
            metadata_version=client.metadata_version,
            subscriptions=(client.subscriptions if joining or client.send_subscriptions else None),
            owned=frozenset(client.owned),
            revoking=frozenset(client.revoking),
            # Reads of these fail at the fence (only possible after lost writes).
            fence_failed=frozenset(
                s for s in client.owned if self.fences.get(s) != (mid, client.grants[s])
            ),
            sequence=client.sequence,
        )
        client.sent = [*client.sent[-4:], request]
        result = self._deliver(request, replaced=joining)
        if lose:
            return result
        if self.refused.get(mid) is not None:
            # The shell answered FENCED: the grant was refused by a newer fence.
            client.drop_everything()
            return result
        if result.status is HeartbeatStatus.OK:
            client.epoch = result.member_epoch
            client.metadata_version = result.group.metadata_version
            client.send_subscriptions = False
            granted = set(result.assigned)
            for shard in client.owned - granted:
                if drain > 0:
                    client.revoking[shard] = drain
            client.owned = granted
            client.grants = dict(result.assigned)
            for shard in granted:
                client.revoking.pop(shard, None)
                # ctx.fencing_token of a shard never goes down for a member.
                assert result.assigned[shard] >= client.highest.get(shard, 0) or self.lost_writes
                client.highest[shard] = max(client.highest.get(shard, 0), result.assigned[shard])
        else:
            client.drop_everything()  # FENCED, UNKNOWN_MEMBER, SYNC_METADATA: rejoin
        return result

    def _deliver(self, request: HeartbeatInput, *, replaced: bool = False) -> HeartbeatResult:
        """The coordinator's side of one request, as the shell runs it."""
        mid = request.member_id
        request = replace(request, last_sequence=self.sequences.get(mid, 0))
        before = self.group
        result = heartbeat(
            self.group, self.topology, request, self.now, self.config, hold_grants=self.hold_grants
        )
        acted = result.renews_lease or not result.is_noop
        if request.stale or result.status is not HeartbeatStatus.OK:
            # Stale requests and refusals write nothing at all (finding 2, finding 3).
            assert result.is_noop and not result.renews_lease
            assert result.group is before
        if acted and request.sequence is not None:
            self.sequences[mid] = request.sequence
        self.refused = self._apply(
            result, actor=mid, reported=request.reported(), replaced=replaced
        )
        if self.hold_grants:
            assert result.fences == (), "a grant while grants are held"
        if result.renews_lease and not self.refused.get(mid):
            self.leases[mid] = self.now + self.config.lease_ttl_ms
        if result.status is HeartbeatStatus.OK and result.member_epoch >= 0 and not self.refused:
            record = self.group.members[mid]
            assert result.member_epoch == record.epoch
            assert result.assigned == record.assigned
            assert result.revoke == record.pending_revocation
            assert result.pending == record.target - set(record.assigned)
            # The owner fence of every shard the member may read names it already.
            for shard, token in result.assigned.items():
                assert self.fences[shard] == (mid, token) or self.lost_writes
        if result.status is HeartbeatStatus.SYNC_METADATA:
            assert self.lost_writes
            assert result.assigned == {} and result.member_epoch == 0  # grants nothing
        return result

    # -- rules ---------------------------------------------------------------------

    @initialize(count=st.integers(1, 4))
    def start_some_members(self, count: int) -> None:
        for mid in MEMBER_IDS[:count]:
            self.start(mid, frozenset(STREAMS))
            self._heartbeat(mid, lose=False, drain=0)

    @rule(
        order=st.permutations(MEMBER_IDS),
        losses=st.lists(st.sampled_from([False] * 5 + [True]), min_size=5, max_size=5),
        drain=DRAIN_HEARTBEATS,
        pause=st.sampled_from([100, 200, 1_000]),
    )
    def heartbeat_round(self, order: list[str], losses: list[bool], drain: int, pause: int) -> None:
        """Every running member heartbeats once, some responses get lost."""
        self.now += pause
        for mid, lose in zip(order, losses, strict=True):
            self._heartbeat(mid, lose=lose, drain=drain)

    @rule(
        mid=st.sampled_from(MEMBER_IDS), streams=st.frozensets(st.sampled_from(STREAMS), min_size=1)
    )
    def start(self, mid: str, streams: frozenset[str]) -> None:
        client = self.clients[mid]
        if client.alive:
            return
        client.alive = True
        client.drop_everything()
        client.subscriptions = streams if self.heterogeneous else frozenset(STREAMS)

    @rule(
        mid=st.sampled_from(MEMBER_IDS),
        lose=st.sampled_from([False, False, False, True]),
        drain=DRAIN_HEARTBEATS,
    )
    def send_heartbeat(self, mid: str, lose: bool, drain: int) -> None:
        self._heartbeat(mid, lose=lose, drain=drain)

    @rule(mid=st.sampled_from(MEMBER_IDS), back=st.integers(1, 5))
    def deliver_again(self, mid: str, back: int) -> None:
        """The network delivers one of the member's last requests again: a duplicate
        of the newest (a re-send after a timeout), or an older one, late (a request
        stalled in a replica while the member moved on). It acts on nothing."""
        client = self.clients[mid]
        if len(client.sent) < back:
            return
        request = client.sent[-back]
        before, leases = self.group, dict(self.leases)
        self._deliver(request)
        if not self.lost_writes:
            assert self.group is before and self.leases == leases, "a replayed request acted"

    @rule(hold=st.booleans())
    def redis_clock_steps(self, hold: bool) -> None:
        """A step of the Redis clock holds grants (and settles)."""
        self.hold_grants = hold

    @rule(mid=st.sampled_from(MEMBER_IDS))
    def leave(self, mid: str) -> None:
        client = self.clients[mid]
        if not client.alive:
            return
        client.sequence += 1
        request = HeartbeatInput(mid, -1, client.metadata_version, sequence=client.sequence)
        client.sent = [*client.sent[-4:], request]
        result = self._deliver(request)
        assert result.status is HeartbeatStatus.OK
        assert mid not in self.group.live_members()
        self.leases.pop(mid, None)
        client.alive = False
        client.drop_everything()
        client.sent.clear()

    @rule(mid=st.sampled_from(MEMBER_IDS))
    def crash(self, mid: str) -> None:
        client = self.clients[mid]
        client.alive = False
        client.drop_everything()
        client.sent.clear()

    @rule(ms=st.sampled_from([1, 500, 2_000, 9_999, 10_000, 12_000, 30_000, 70_000]))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule()
    def expire_leases(self) -> None:
        due = sorted(mid for mid, until in self.leases.items() if until <= self.now)
        self._apply(expire_members(self.group, due, self.now))
        for mid in due:
            del self.leases[mid]
            assert mid not in self.group.live_members()

    @rule()
    def fence_overdue(self) -> None:
        before = self.group
        self._apply(fence_overdue_revocations(self.group, self.now, self.config, self.leases))
        for member in self.group.live_members().values():
            deadline = member.revocation_deadline_ms
            assert deadline is None or deadline > self.now
        for mid, member in self.group.members.items():
            old = before.members.get(mid)
            if old is None or not old.is_live or member.is_live:
                continue
            # Fenced with a valid lease: its runs may go on until that lease would have
            # expired, so its shards stay out of reach until then
            # (docs/guarantees.md#exclusive-processing).
            lease = self.leases.get(mid)
            if lease is not None and lease > self.now:
                assert member.quarantined == old.held()
                assert member.quarantined_until_ms == lease

    @rule()
    def release_quarantines(self) -> None:
        self._apply(release_quarantines(self.group, self.now))
        for member in self.group.members.values():
            until = member.quarantined_until_ms
            assert until is None or until > self.now

    @rule()
    def remove_stale(self) -> None:
        self._apply(remove_stale_members(self.group, self.now, self.config))

    @rule()
    def compute_target(self) -> None:
        result = compute_target_if_due(self.group, self.topology, self.now, self.config)
        self._apply(result)
        assert result.fences == ()

    @rule(stream=st.sampled_from(STREAMS), delta=st.sampled_from([-1, 1, 2]))
    def change_shards(self, stream: str, delta: int) -> None:
        self.shard_counts[stream] = max(0, min(8, self.shard_counts[stream] + delta))
        if delta > 1:
            # A scale-out after a scale-in uses a new incarnation: ids never repeat.
            self.incarnation += 1
        self.topology_version += 1
        self.topology = self._build_topology()

    @precondition(lambda self: self.converged_checks < 2)
    @rule()
    def converge(self) -> None:
        """With stable membership and honest clients the group converges (invariant 5)."""
        self.converged_checks += 1
        for client in self.clients.values():  # honest from now on: hung handlers finish
            for shard in client.revoking:
                client.revoking[shard] = min(client.revoking[shard], 2)
        self.hold_grants = False  # the Redis clock settled
        rounds = self.config.lease_ttl_ms // self.config.heartbeat_interval_ms + 10
        for _ in range(rounds):
            self.now += self.config.heartbeat_interval_ms
            self.expire_leases()
            self.fence_overdue()
            self.release_quarantines()
            self.compute_target()
            for mid in MEMBER_IDS:
                self._heartbeat(mid, lose=False, drain=1)
            if self._settled():
                break
        assert self._settled(), f"not converged after {rounds} rounds: {self.group.state}"
        self._check_balance()
        self._check_fences(even_after_lost_writes=True)
        if not self.heterogeneous:
            self._check_join_moves_little()

    # -- convergence checks ------------------------------------------------------------

    def _alive(self) -> set[str]:
        return {mid for mid, c in self.clients.items() if c.alive}

    def _settled(self) -> bool:
        live = self.group.live_members()
        return (
            set(live) == self._alive()
            and self.group.state in (GroupState.STABLE, GroupState.EMPTY)
            # A member just told FENCED (its responses were lost twice in a row) still
            # has its record until it rejoins on its next heartbeat: not settled yet.
            and all(self.clients[mid].epoch == member.epoch for mid, member in live.items())
        )

    def _check_balance(self) -> None:
        live = self.group.live_members()
        subscribed = set().union(*(m.subscriptions for m in live.values())) if live else set()
        expected = {s for stream in subscribed for s in self.topology.shards_of(stream)}
        assigned = [s for m in live.values() for s in m.assigned]
        assert sorted(assigned) == sorted(expected), "not every assignable shard is assigned"
        for mid, member in live.items():
            assert set(member.assigned) == member.target
            assert self.clients[mid].owned == set(member.assigned)
        classes: dict[frozenset[str], list[int]] = {}
        for member in live.values():
            effective = frozenset(s for s in member.subscriptions if self.topology.shards_of(s))
            classes.setdefault(effective, []).append(len(member.assigned))
        for sizes in classes.values():
            assert max(sizes) - min(sizes) <= 1, f"unbalanced: {sizes}"

    def _check_join_moves_little(self) -> None:
        """Invariant 6: a join into a stable group moves at most ⌈shards/members⌉."""
        idle = [mid for mid in MEMBER_IDS if not self.clients[mid].alive]
        if not idle:
            return
        before = {s: mid for mid, m in self.group.live_members().items() for s in m.target}
        self.start(idle[0], frozenset(STREAMS))
        self._heartbeat(idle[0], lose=False, drain=1)
        self.now += self.config.assignment_interval_ms
        self.compute_target()
        after = {s: mid for mid, m in self.group.live_members().items() for s in m.target}
        moved = sum(1 for s, mid in after.items() if before.get(s, mid) != mid)
        members = len(self.group.live_members())
        if members:  # (after lost writes the newcomer's grant may be refused: fenced)
            assert moved <= math.ceil(len(after) / members)

    # -- invariants checked after every step ------------------------------------------------

    @invariant()
    def no_shard_has_two_live_holders(self) -> None:  # invariant 1
        # A fenced member's quarantine counts as holding: no live member may have it.
        # (Two tombstones may quarantine one shard: a member fenced after lost writes,
        # and the record of the lost grant's owner.)
        seen: dict[str, str] = {}
        for mid, member in self.group.members.items():
            if member.is_live:
                for shard in member.held():
                    assert shard not in seen, f"{shard} held by {seen.get(shard)} and {mid}"
                    seen[shard] = mid
        for mid, member in self.group.members.items():
            for shard in member.quarantined:
                assert shard not in seen, f"{shard} held by {seen.get(shard)}, {mid} quarantines"

    @invariant()
    def shards_a_live_member_still_reads_stay_its_own(self) -> None:  # E6, clients' view
        # Until a member reports a shard revoked (or expires, or is fenced), the
        # coordinator keeps it as that member's: nobody else can be granted it.
        # (After lost writes only the fences protect: see WriteLossMachine.)
        if self.lost_writes:
            return
        holders = self.group.holders()
        for mid, client in self.clients.items():
            record = self.group.members.get(mid)
            if not client.alive or record is None or not record.is_live:
                continue
            for shard in client.owned | set(client.revoking):
                assert holders.get(shard) == mid, f"{mid} still reads {shard}"

    @invariant()
    def live_holdings_match_their_fences(self) -> None:
        self._check_fences(even_after_lost_writes=False)

    def _check_fences(self, *, even_after_lost_writes: bool) -> None:
        if self.lost_writes and not even_after_lost_writes:
            return
        for mid, member in self.group.live_members().items():
            for shard, token in member.assigned.items():
                assert self.fences.get(shard) == (mid, token)

    @invariant()
    def epochs_are_ordered(self) -> None:
        group = self.group
        assert group.target_epoch <= group.group_epoch
        for member in group.live_members().values():
            assert member.epoch <= group.target_epoch
            assert all(t <= group.last_token for t in member.assigned.values())
            if member.state is MemberState.STABLE and member.epoch == group.target_epoch:
                assert set(member.assigned) == member.target
            if member.state is MemberState.UNREVOKED:
                assert member.pending_revocation
                assert member.revocation_deadline_ms is not None

    @invariant()
    def targets_are_disjoint(self) -> None:
        seen: set[str] = set()
        current = self.group.group_epoch == self.group.target_epoch
        for member in self.group.live_members().values():
            assert seen.isdisjoint(member.target)
            seen |= member.target
            if current:  # a pending recomputation may lag behind a resubscription
                for shard in member.target:
                    assert stream_of(shard) in member.subscriptions

    @invariant()
    def dead_records_hold_nothing(self) -> None:
        for member in self.group.members.values():
            if not member.is_live:
                # A dead record holds nothing but a fenced member's quarantine.
                assert not member.assigned and not member.pending_revocation
                assert member.held() == member.quarantined
                if member.quarantined:
                    assert member.state is MemberState.FENCED
                    assert member.quarantined_until_ms is not None
                assert member.target == frozenset()
                assert member.expired_at_ms is not None
        if self.group.state is GroupState.EMPTY:
            assert self.group.live_members() == {}


class BatchedHeterogeneousMachine(GroupMachine):
    """Mixed subscriptions, resubscriptions and batched target computation."""

    config = replace(GroupMachine.config, assignment_interval_ms=2_500)
    heterogeneous = True

    @rule(
        mid=st.sampled_from(MEMBER_IDS), streams=st.frozensets(st.sampled_from(STREAMS), min_size=1)
    )
    def resubscribe(self, mid: str, streams: frozenset[str]) -> None:
        client = self.clients[mid]
        if client.alive and client.epoch > 0:
            client.subscriptions = streams
            client.send_subscriptions = True


class WriteLossMachine(GroupMachine):
    """Redis loses recent metadata writes (failover, restore): E19, E20.

    The group reverts to an older snapshot while the shards' owner fences and the
    members' own views stay newer. Members that saw newer metadata get
    SYNC_METADATA (no grants: they rejoin), stale epochs get FENCED, fence writes
    below a surviving fence the metadata does not know are refused (the member is
    fenced and quarantined, the token floor raised), members report failed fenced
    reads, and the group must still converge with every fence naming its holder.
    """

    @rule(back=st.integers(1, 6))
    def lose_writes(self, back: int) -> None:
        if len(self.history) < back:
            return
        # The lease set and the sequences share the metadata's hash tag: they lose the
        # writes too.
        self.group, self.leases, self.sequences = self.history[-back]
        self.history = self.history[:-back]
        self.lost_writes = True


# About 4 s per machine; the unit run as a whole stays well under a minute.
_machine_settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = _machine_settings
TestBatchedHeterogeneousMachine = BatchedHeterogeneousMachine.TestCase
TestBatchedHeterogeneousMachine.settings = _machine_settings
TestWriteLossMachine = WriteLossMachine.TestCase
TestWriteLossMachine.settings = _machine_settings


# -- the model's documents ------------------------------------------------------------

shard_ids = st.builds(lambda s, i: f"{s}/{i}@0", st.sampled_from(STREAMS), st.integers(0, 20))


@st.composite
def members(draw: st.DrawFn) -> Member:
    state = draw(st.sampled_from(list(MemberState)))
    pending = draw(st.frozensets(shard_ids, max_size=3))
    assigned = draw(st.dictionaries(shard_ids, st.integers(0, 50), max_size=4))
    for shard in pending:
        assigned.pop(shard, None)
    return Member(
        member_id=draw(st.text(min_size=1, max_size=10)),
        epoch=draw(st.integers(0, 2**31 - 1)),
        previous_epoch=draw(st.integers(0, 100)),
        state=state,
        subscriptions=draw(st.frozensets(st.sampled_from(STREAMS))),
        assigned=assigned,
        pending_revocation=pending,
        target=draw(st.frozensets(shard_ids, max_size=4)),
        revocation_deadline_ms=draw(st.none() | st.integers(0, 2**40)),
        rebalance_timeout_ms=draw(st.integers(1, 10**6)),
        client=draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)),
        joined_at_ms=draw(st.integers(0, 2**40)),
        expired_at_ms=draw(st.none() | st.integers(0, 2**40)),
    )


@settings(max_examples=200, deadline=None)
@given(members())
def test_member_document_round_trips_through_json(member: Member) -> None:
    document = json.loads(json.dumps(member.to_dict()))
    assert Member.from_dict(document) == member
    assert json.dumps(member.to_dict()) == json.dumps(Member.from_dict(document).to_dict())


@settings(max_examples=100, deadline=None)
@given(st.lists(members(), max_size=4, unique_by=lambda m: m.member_id), st.integers(0, 9))
def test_group_header_round_trips(group_members: list[Member], epoch: int) -> None:
    group = Group(
        group_id="g",
        group_epoch=epoch + 3,
        target_epoch=epoch,
        metadata_version=7,
        topology_version={"a": 2},
        last_assignment_ms=123,
        members={m.member_id: m for m in group_members},
    )
    header = json.loads(json.dumps(group.to_header()))
    assert Group.from_header(header, group.members.values()) == group


def _member_doc() -> dict[str, object]:
    return Member.joining(
        "m", subscriptions=frozenset({"a"}), rebalance_timeout_ms=5, client={"host": "h"}, now_ms=1
    ).to_dict()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("state", "DANCING"),
        ("epoch", "3"),
        ("epoch", True),
        ("epoch", -1),
        ("member_id", ""),
        ("subscriptions", "a"),
        ("subscriptions", [1]),
        ("assigned", {"a/0@0": "1"}),
        ("assigned", ["a/0@0"]),
        ("client", {"host": 1}),
        ("revocation_deadline_ms", 1.5),
        ("rebalance_timeout_ms", 0),
    ],
)
def test_malformed_member_document_is_rejected(key: str, value: object) -> None:
    document = _member_doc()
    document[key] = value
    with pytest.raises(ValueError, match=r"."):
        Member.from_dict(document)


#: Keys added after the first release: a record written before them decodes without.
_OPTIONAL_MEMBER_KEYS = frozenset({"quarantined", "quarantined_until_ms"})


@pytest.mark.parametrize("key", sorted(set(_member_doc()) - _OPTIONAL_MEMBER_KEYS))
def test_member_document_missing_a_key_is_rejected(key: str) -> None:
    document = _member_doc()
    del document[key]
    with pytest.raises(ValueError, match=key):
        Member.from_dict(document)


def test_member_document_without_quarantine_keys_quarantines_nothing() -> None:
    document = _member_doc()
    for key in _OPTIONAL_MEMBER_KEYS:
        del document[key]
    member = Member.from_dict(document)
    assert member.quarantined == frozenset() and member.quarantined_until_ms is None


@pytest.mark.parametrize(
    ("state", "until"),
    [("STABLE", 5), ("FENCED", None)],
)
def test_quarantine_only_on_a_tombstone_with_an_end(state: str, until: int | None) -> None:
    document = _member_doc()
    document.update(state=state, quarantined=["a/0@0"], quarantined_until_ms=until, expired_at_ms=1)
    with pytest.raises(ValueError, match="quarantine"):
        Member.from_dict(document)


def test_member_document_overlapping_assigned_and_revoking_is_rejected() -> None:
    document = _member_doc()
    document["assigned"] = {"a/0@0": 1}
    document["pending_revocation"] = ["a/0@0"]
    with pytest.raises(ValueError, match="both assigned and revoked"):
        Member.from_dict(document)


def test_member_document_ignores_unknown_keys() -> None:
    document = _member_doc()
    document["added_by_a_newer_coordinator"] = 1
    assert Member.from_dict(document).member_id == "m"


@pytest.mark.parametrize(
    "header",
    [
        None,
        [],
        {"group_id": "g"},
        {
            "group_id": "g",
            "group_epoch": 1,
            "target_epoch": 2,
            "metadata_version": 0,
            "topology_version": {},
            "last_assignment_ms": 0,
        },
        {
            "group_id": "g",
            "group_epoch": 1,
            "target_epoch": 1,
            "metadata_version": 0,
            "topology_version": {"a": "1"},
            "last_assignment_ms": 0,
        },
    ],
)
def test_malformed_group_header_is_rejected(header: object) -> None:
    with pytest.raises(ValueError, match=r"."):
        Group.from_header(header)


def test_duplicate_members_are_rejected() -> None:
    m = Member.from_dict(_member_doc())
    with pytest.raises(ValueError, match="duplicate"):
        Group.from_header(Group("g").to_header(), [m, m])


def test_values_are_immutable_copies() -> None:
    assigned = {"a/0@0": 1}
    m = replace(Member.from_dict(_member_doc()), assigned=assigned)
    assigned["a/1@0"] = 1
    assert dict(m.assigned) == {"a/0@0": 1}
    with pytest.raises(TypeError):
        m.assigned["x"] = 1  # type: ignore[index]


def test_group_state_is_derived() -> None:
    m = Member.from_dict(_member_doc())
    assert Group("g").state is GroupState.EMPTY
    dead = replace(m, state=MemberState.EXPIRED, expired_at_ms=5)
    assert Group("g", 1, 1, members={"m": dead}).state is GroupState.EMPTY
    assert Group("g", 2, 1, members={"m": m}).state is GroupState.ASSIGNING
    assert Group("g", 1, 1, members={"m": m}).state is GroupState.RECONCILING
    assert Group("g", 1, 1, members={"m": replace(m, epoch=1)}).state is GroupState.STABLE
    unreleased = replace(m, epoch=1, state=MemberState.UNRELEASED)
    assert Group("g", 1, 1, members={"m": unreleased}).state is GroupState.RECONCILING


def test_holders_cover_assigned_and_revoking_of_live_members_only() -> None:
    m = Member.from_dict(_member_doc())
    live = replace(m, assigned={"a/0@0": 1}, pending_revocation=frozenset({"a/1@0"}))
    dead = replace(m, member_id="d", state=MemberState.FENCED, assigned={"a/2@0": 1})
    group = Group("g", 1, 1, members={"m": live, "d": dead})
    assert group.holders() == {"a/0@0": "m", "a/1@0": "m"}
    assert set(group.live_members()) == {"m"}


@pytest.mark.parametrize(
    "shards",
    [{"a": ("a/0@0", "a/0@0")}, {"a": ("b/0@0",)}],
)
def test_inconsistent_topology_is_rejected(shards: dict[str, tuple[str, ...]]) -> None:
    with pytest.raises(ValueError, match="topology"):
        Topology(shards=shards)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lease_ttl_ms": 0},
        {"assignment_interval_ms": -1},
        {"heartbeat_interval_ms": 10_000, "lease_ttl_ms": 10_000},
    ],
)
def test_invalid_config_is_rejected(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigurationError):
        CoreConfig(**kwargs)


def test_group_edit_reports_only_real_changes() -> None:
    m = Member.from_dict(_member_doc())
    group = Group("g", 1, 1, members={"m": m})
    edit = GroupEdit(group)
    edit.put(replace(m))  # rewritten but equal
    edit.put(replace(m, epoch=1))
    edit.put(m)  # and back
    edit.remove("ghost")
    assert edit.finish() == (group, frozenset(), frozenset(), False)
    edit.put(replace(m, member_id="n"))
    edit.remove("m")
    new, changed, removed, header_changed = edit.finish()
    assert set(new.members) == {"n"}
    assert changed == {"m", "n"}
    assert removed == {"m"}
    assert not header_changed


def _fence_script(last: tuple[str, int] | None, new: tuple[str, int], known: int) -> str:
    """What ``fence.lua`` does with a write of ``new`` over ``last``, ``known`` being the
    highest token the writer's metadata recorded: ``written``, ``refused`` or ``kept``
    (a newer grant to the same member is in place)."""
    if last is None or last == new:
        return "written"
    if last[1] >= new[1]:
        return "kept" if last[0] == new[0] else "refused"
    if last[1] > known and last[0] != new[0]:
        return "refused"
    return "written"


def _check_derived(group: Group) -> None:
    """The derived maps of ``group`` (patched step by step) equal a fresh computation."""
    fresh = Group.from_header(group.to_header(), group.members.values())
    assert group.holders() == fresh.holders() == fresh._compute_holders()
    assert group.live_count() == fresh.live_count() == len(fresh.live_members())
    assert dict(group.subscribers()) == dict(fresh.subscribers())
    assert group.live_subscriptions() == {
        s for m in group.members.values() if m.is_live for s in m.subscriptions
    }
    assert group.timer_deadlines() == fresh.timer_deadlines()

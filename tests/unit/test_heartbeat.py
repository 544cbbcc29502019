"""The heartbeat step and the timers, transition by transition."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from streamworks.coordinator.core import (
    CoreConfig,
    Group,
    GroupChange,
    GroupState,
    HeartbeatInput,
    HeartbeatResult,
    HeartbeatStatus,
    InvalidHeartbeat,
    Member,
    MemberState,
    Topology,
    compute_target_if_due,
    expire_members,
    fence_overdue_revocations,
    heartbeat,
    next_deadline_ms,
    raise_token_floor,
    release_quarantines,
    remove_stale_members,
)
from streamworks.coordinator.core.heartbeat import MAX_EPOCH
from streamworks.coordinator.core.recovery import empty_group, fence_after_regression
from streamworks.coordinator.core.tokens import TOKENS_PER_MS, next_token, parse_token

OK = HeartbeatStatus.OK
FENCED = HeartbeatStatus.FENCED
UNKNOWN = HeartbeatStatus.UNKNOWN_MEMBER
SYNC = HeartbeatStatus.SYNC_METADATA


def orders(n: int, version: int = 1) -> Topology:
    return Topology(
        shards={"orders": tuple(f"orders/{i}@0" for i in range(n))}, versions={"orders": version}
    )


class Harness:
    """One group driven through the core, keeping the shell's bookkeeping."""

    def __init__(self, topology: Topology | None = None, config: CoreConfig | None = None):
        self.group = Group("g")
        self.topology = topology or orders(4)
        self.config = config or CoreConfig()
        self.now = 10_000
        self.fences: dict[str, tuple[str, int]] = {}

    def apply(self, result: GroupChange) -> None:
        before = self.group
        self.group = result.group
        # The change set names exactly what differs: the shell writes only that.
        assert result.header_changed == (before.to_header() != result.group.to_header())
        differing = {
            mid
            for mid in set(before.members) | set(result.group.members)
            if before.members.get(mid) != result.group.members.get(mid)
        }
        assert result.changed_members == differing
        assert result.removed_members == set(before.members) - set(result.group.members)
        for fence in result.fences:
            # Tokens only grow per shard (the fence script refuses anything else).
            assert fence.token > self.fences.get(fence.shard, ("", -1))[1]
            self.fences[fence.shard] = (fence.member_id, fence.token)

    def hb(
        self,
        member_id: str,
        epoch: int,
        *,
        owned: Iterable[str] | None = (),
        revoking: Iterable[str] = (),
        subscriptions: Iterable[str] | None = None,
        metadata_version: int | None = None,
        fence_failed: Iterable[str] = (),
        client: dict[str, str] | None = None,
        sequence: int | None = None,
        last_sequence: int = 0,
        hold_grants: bool = False,
    ) -> HeartbeatResult:
        request = HeartbeatInput(
            member_id=member_id,
            member_epoch=epoch,
            metadata_version=(
                self.group.metadata_version if metadata_version is None else metadata_version
            ),
            subscriptions=None if subscriptions is None else frozenset(subscriptions),
            owned=None if owned is None else frozenset(owned),
            revoking=frozenset(revoking),
            client=client,
            fence_failed=frozenset(fence_failed),
            sequence=sequence,
            last_sequence=last_sequence,
        )
        result = heartbeat(
            self.group, self.topology, request, self.now, self.config, hold_grants=hold_grants
        )
        self.apply(result)
        return result

    def join(self, member_id: str, streams: Iterable[str] = ("orders",)) -> HeartbeatResult:
        return self.hb(member_id, 0, subscriptions=streams, metadata_version=0)

    def steady(self, member_id: str) -> HeartbeatResult:
        """Heartbeat as an honest member that already dropped what it must revoke."""
        m = self.member(member_id)
        return self.hb(member_id, m.epoch, owned=m.assigned)

    def member(self, member_id: str) -> Member:
        return self.group.members[member_id]


def settle(h: Harness, members: Iterable[str]) -> None:
    """Heartbeat every member (honestly) until the group is STABLE."""
    for _ in range(5):
        for mid in members:
            h.steady(mid)
        if h.group.state is GroupState.STABLE:
            return
    raise AssertionError(f"not settled: {h.group.state}")


def two_members_splitting_four_shards() -> tuple[Harness, frozenset[str]]:
    """``a`` holds all four shards; ``b`` joined and waits for the two it should get."""
    h = Harness()
    h.join("a")
    h.join("b")
    r = h.hb("a", 1, owned=h.member("a").assigned)
    assert len(r.revoke) == 2
    return h, r.revoke


# -- join ---------------------------------------------------------------------


def test_first_join_gets_everything_with_fences() -> None:
    h = Harness()
    r = h.join("a")
    assert r.status is OK
    assert r.member_epoch == 1
    assert set(r.assigned) == set(h.topology.shards["orders"])
    # Granted under one fence token made from Redis time (tokens.py), recorded.
    token = h.now * TOKENS_PER_MS
    assert set(r.assigned.values()) == {token} and h.group.last_token == token
    assert {f.shard for f in r.fences} == set(r.assigned)
    assert all(f.member_id == "a" and f.token == token for f in r.fences)
    assert r.changed_members == {"a"}
    assert r.header_changed
    assert h.group.state is GroupState.STABLE
    assert (h.group.group_epoch, h.group.target_epoch, h.group.metadata_version) == (1, 1, 1)
    assert h.group.topology_version == {"orders": 1}
    assert r.renews_lease


def test_no_op_heartbeat_writes_nothing() -> None:
    h = Harness()
    h.join("a")
    before = h.group
    r = h.steady("a")
    assert r.status is OK
    assert r.changed_members == frozenset()
    assert not r.header_changed
    assert r.fences == ()
    assert r.is_noop
    assert r.group is before
    assert r.heartbeat_interval_ms == h.config.heartbeat_interval_ms


def test_client_info_change_writes_the_member_without_a_rebalance() -> None:
    h = Harness()
    h.join("a")
    r = h.hb("a", 1, owned=h.member("a").assigned, client={"host": "x"})
    assert r.changed_members == {"a"}
    assert not r.header_changed
    assert h.member("a").client == {"host": "x"}


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (HeartbeatInput("a", 0, 0, subscriptions=None), "subscriptions"),
        (HeartbeatInput("a", 0, 0, subscriptions=frozenset()), "subscriptions"),
        (HeartbeatInput("a", 0, 0, frozenset({"orders"}), owned=frozenset({"x"})), "own"),
        (HeartbeatInput("a", 0, 0, frozenset({"orders"}), revoking=frozenset({"x"})), "own"),
        (HeartbeatInput("a", -2, 0), "member_epoch"),
        (HeartbeatInput("a", 2**31, 0), "member_epoch"),
        (HeartbeatInput("", 1, 0), "member_id"),
        (HeartbeatInput("a", 1, -1), "metadata_version"),
        (HeartbeatInput("a", 0, 0, frozenset({"bad name"})), "stream name"),
        (HeartbeatInput("a", 0, 0, frozenset({"o"}), rebalance_timeout_ms=0), "rebalance"),
    ],
)
def test_invalid_requests_are_rejected(request_: HeartbeatInput, message: str) -> None:
    with pytest.raises(InvalidHeartbeat, match=message):
        heartbeat(Group("g"), orders(2), request_, 0, CoreConfig())


def test_rejoin_replaces_a_live_record_and_frees_its_shards() -> None:
    h = Harness()
    h.join("a")
    old_epoch = h.group.group_epoch
    old_token = h.group.last_token
    r = h.join("a")  # e.g. the member was fenced and dropped everything
    assert r.status is OK
    assert h.group.group_epoch == old_epoch + 1
    assert r.member_epoch == h.group.group_epoch
    # Re-granted under a new token (same millisecond: the next one), fences rewritten.
    assert {f.token for f in r.fences} == {old_token + 1} == {h.group.last_token}
    assert len(r.fences) == 4


# -- leave --------------------------------------------------------------------


def test_leave_frees_shards_at_once() -> None:
    h, _ = two_members_splitting_four_shards()
    epoch = h.group.group_epoch
    r = h.hb("a", -1)
    assert r.status is OK
    assert r.member_epoch == -1
    assert not r.renews_lease
    # No tombstone: the record is gone (status does not list it as EXPIRED) and a
    # late heartbeat from it is answered UNKNOWN_MEMBER all the same.
    assert "a" not in h.group.members
    assert "a" in r.removed_members
    assert h.group.group_epoch == epoch + 1
    assert h.hb("a", 2).status is HeartbeatStatus.UNKNOWN_MEMBER
    r = h.steady("b")
    assert len(r.assigned) == 4
    assert all(h.fences[s] == ("b", r.assigned[s]) for s in r.assigned)


def test_unknown_or_repeated_leave_is_a_no_op() -> None:
    h = Harness()
    h.join("a")
    before = h.group
    r = h.hb("ghost", -1)
    assert r.status is OK
    assert r.is_noop
    assert r.group is before
    h.hb("a", -1)
    assert h.group.state is GroupState.EMPTY
    assert h.hb("a", -1).is_noop


def test_last_leave_empties_the_group() -> None:
    h = Harness()
    h.join("a")
    h.hb("a", -1)
    assert h.group.state is GroupState.EMPTY
    assert h.group.target_epoch == h.group.group_epoch
    assert h.group.members == {}


# -- epochs and fencing ---------------------------------------------------------


def test_lost_response_with_previous_epoch_is_accepted() -> None:
    h, _ = two_members_splitting_four_shards()
    kept = set(h.member("a").assigned)
    h.hb("a", 1, owned=kept)  # acknowledges: epoch moves to 2, response lost
    assert h.member("a").epoch == 2
    assert h.member("a").previous_epoch == 1
    r = h.hb("a", 1, owned=kept)  # resent with the old epoch
    assert r.status is OK
    assert r.member_epoch == 2
    assert set(r.assigned) == kept


def test_previous_epoch_owning_more_than_assigned_is_fenced() -> None:
    h, revoked = two_members_splitting_four_shards()
    kept = set(h.member("a").assigned)
    h.hb("a", 1, owned=kept)
    r = h.hb("a", 1, owned=kept | revoked)
    assert r.status is FENCED
    assert r.member_epoch == 0
    assert r.assigned == {}
    assert not r.renews_lease


@pytest.mark.parametrize(("epoch", "status"), [(1, FENCED), (2, OK), (3, OK), (4, FENCED)])
def test_epoch_check(epoch: int, status: HeartbeatStatus) -> None:
    h = Harness()
    h.join("a")
    a = replace(h.member("a"), epoch=3, previous_epoch=2)
    h.group = replace(h.group, group_epoch=4, target_epoch=4, members={"a": a})
    before = h.group
    r = h.hb("a", epoch, owned=a.assigned)
    assert r.status is status
    if status is FENCED:
        assert r.is_noop
        assert r.group is before


def test_unknown_member_id() -> None:
    h = Harness()
    h.join("a")
    r = h.hb("ghost", 4)
    assert r.status is UNKNOWN
    assert not r.renews_lease


def test_expired_member_gets_unknown_member() -> None:
    h = Harness()
    h.join("a")
    h.apply(expire_members(h.group, ["a"], h.now))
    assert h.hb("a", 1, owned=()).status is UNKNOWN


def test_fenced_member_quarantine_ends_at_its_recorded_lease() -> None:
    h, _ = two_members_splitting_four_shards()
    deadline = h.member("a").revocation_deadline_ms
    assert deadline is not None
    h.now = deadline
    held = h.member("a").held()
    recorded = h.now + 1_234
    h.apply(fence_overdue_revocations(h.group, h.now, h.config, {"a": recorded}))
    assert h.member("a").quarantined == held
    assert h.member("a").quarantined_until_ms == recorded
    # The FENCED answer renews nothing: the quarantine's end stays where it was.
    r = h.hb("a", h.member("a").epoch, owned=sorted(held))
    assert r.status is FENCED and not r.renews_lease
    assert h.member("a").quarantined_until_ms == recorded
    # A rejoin (sent only once the member's runs ended) replaces the tombstone.
    h.join("a")
    assert h.member("a").quarantined == frozenset()


def test_fenced_member_gets_fenced_then_rejoins() -> None:
    h, _ = two_members_splitting_four_shards()
    h.now += 60_000
    h.apply(fence_overdue_revocations(h.group, h.now))
    assert h.member("a").state is MemberState.FENCED
    assert h.hb("a", 1, owned=()).status is FENCED
    r = h.join("a")
    assert r.status is OK
    assert h.member("a").state.is_live


# -- requests that cannot lie (issue 18, finding 2) -----------------------------------


@pytest.mark.parametrize("epoch", [2, 40, MAX_EPOCH])
def test_an_unknown_member_with_any_epoch_changes_nothing(epoch: int) -> None:
    """Finding 2: an unknown member id posting a huge epoch used to raise (and commit)
    the group epoch to 2**31 before it was found unknown, bricking the group."""
    h = Harness()
    h.join("a")
    before = h.group
    r = h.hb("ghost", epoch, owned=["orders/0@0"], metadata_version=MAX_EPOCH)
    assert r.status is UNKNOWN and r.member_epoch == 0 and r.assigned == {}
    assert r.is_noop and not r.renews_lease and r.group is before
    assert h.steady("a").status is OK  # the honest member goes on


def test_a_known_member_reporting_an_epoch_above_the_group_is_fenced_without_a_write() -> None:
    h = Harness()
    h.join("a")
    before = h.group
    r = h.hb("a", before.group_epoch + 1, owned=h.member("a").assigned)
    assert r.status is FENCED and r.assigned == {}
    assert r.is_noop and not r.renews_lease and r.group is before


@given(
    member=st.sampled_from(["a", "b", "ghost"]),
    epoch=st.integers(-1, MAX_EPOCH),
    version=st.integers(0, MAX_EPOCH),
    owned=st.frozensets(st.sampled_from([f"orders/{i}@0" for i in range(6)])),
)
@hypothesis_settings(max_examples=300, deadline=None)
def test_a_report_above_what_the_group_issued_writes_nothing(
    member: str, epoch: int, version: int, owned: frozenset[str]
) -> None:
    """Whatever epoch, version and claims a request carries: if the epoch or the
    version is above what the group issued, or the member is unknown, nothing is
    written, no lease renewed and nothing granted."""
    h = Harness()
    h.join("a")
    h.join("b")
    h.steady("a")
    h.steady("b")
    before = h.group
    request = HeartbeatInput(
        member, epoch, version, owned=owned if epoch else None, subscriptions=None
    )
    above = epoch > before.group_epoch or version > before.metadata_version
    if epoch == 0 or (epoch == -1 and member != "ghost") or not (above or member == "ghost"):
        return  # a join, a leave, or a report within what was issued: ordinary paths
    r = heartbeat(before, h.topology, request, h.now, h.config)
    assert r.status is not OK or epoch == -1
    assert r.is_noop and not r.renews_lease and r.group is before
    assert r.assigned == {} and r.fences == ()


# -- revoke before assign, pending, E6/E7/E8 --------------------------------------


@pytest.mark.seed("E6")
def test_shard_is_pending_until_previous_owner_revokes() -> None:
    h, revoked = two_members_splitting_four_shards()
    a = h.member("a")
    assert a.state is MemberState.UNREVOKED
    assert a.epoch == 1  # frozen
    assert a.revocation_deadline_ms == h.now + h.config.rebalance_timeout_ms
    r = h.steady("b")
    assert r.pending == revoked
    assert r.assigned == {}
    assert r.heartbeat_interval_ms == h.config.fast_heartbeat_interval_ms
    assert r.fences == ()
    # a still drains: b keeps waiting.
    kept = set(a.assigned)
    r = h.hb("a", 1, owned=kept, revoking=revoked)
    assert r.revoke == revoked
    assert h.steady("b").pending == revoked
    # a acknowledges; b gets the shards on its next heartbeat, under a newer token.
    a_tokens = {s: h.fences[s][1] for s in revoked}
    r = h.hb("a", 1, owned=kept)
    assert r.member_epoch == 2
    assert r.revoke == frozenset()
    r = h.steady("b")
    assert set(r.assigned) == revoked
    assert r.pending == frozenset()
    assert all(h.fences[s] == ("b", r.assigned[s]) for s in revoked)
    assert all(r.assigned[s] > a_tokens[s] for s in revoked)
    assert h.group.state is GroupState.STABLE


@pytest.mark.seed("E7")
def test_draining_member_is_not_given_the_shard_back_while_it_drains() -> None:
    h, revoked = two_members_splitting_four_shards()
    kept = set(h.member("a").assigned)
    for _ in range(3):
        h.now += 1_000
        r = h.hb("a", 1, owned=kept, revoking=revoked)
        assert r.status is OK
        assert r.revoke == revoked
        assert set(r.assigned) == kept
        assert r.member_epoch == 1
        assert r.heartbeat_interval_ms == h.config.fast_heartbeat_interval_ms


@pytest.mark.seed("E6")
def test_pending_shard_is_granted_after_holder_expires() -> None:
    h, revoked = two_members_splitting_four_shards()
    h.now += h.config.lease_ttl_ms
    result = expire_members(h.group, ["a"], h.now)
    h.apply(result)
    assert result.fences == ()
    r = h.steady("b")
    assert set(r.assigned) == set(h.topology.shards["orders"])
    assert all(h.fences[s] == ("b", r.assigned[s]) for s in revoked)


@pytest.mark.seed("E8")
def test_overdue_revocation_is_fenced_and_shard_freed_when_its_lease_would_end() -> None:
    h, revoked = two_members_splitting_four_shards()
    deadline = h.member("a").revocation_deadline_ms
    assert deadline is not None
    assert next_deadline_ms(h.group, h.config) == deadline
    h.now = deadline - 1
    assert fence_overdue_revocations(h.group, h.now, h.config).is_noop
    h.now = deadline
    epoch = h.group.group_epoch
    held = h.member("a").held()
    h.apply(fence_overdue_revocations(h.group, h.now, h.config))
    a = h.member("a")
    assert a.state is MemberState.FENCED
    assert a.expired_at_ms == h.now
    assert h.group.group_epoch == epoch + 1
    # a's lease was still valid: its handlers may run until it would have expired, so
    # its shards are quarantined until then (at most a lease TTL from now), not freed.
    end = h.now + h.config.lease_ttl_ms
    assert a.quarantined == held and a.held() == held
    assert a.quarantined_until_ms == end
    r = h.steady("b")
    assert set(r.assigned).isdisjoint(held)
    assert held <= r.pending
    assert next_deadline_ms(h.group, h.config) == end  # the loop wakes for the release
    h.now = end - 1
    assert release_quarantines(h.group, h.now).is_noop
    h.now = end
    h.apply(release_quarantines(h.group, h.now))
    assert h.member("a").held() == frozenset()
    a_tokens = {s: h.fences[s][1] for s in revoked}
    r = h.steady("b")
    assert set(r.assigned) == set(h.topology.shards["orders"])
    assert all(h.fences[s] == ("b", r.assigned[s]) for s in revoked)
    # Strictly newer than a's grants: the fence script accepts.
    assert all(r.assigned[s] > a_tokens[s] for s in revoked)


# -- expiry, EMPTY, stale removal (E5) ----------------------------------------------


@pytest.mark.seed("E5")
def test_all_members_expire_group_becomes_empty_with_cleared_target() -> None:
    h, _ = two_members_splitting_four_shards()
    epoch, version = h.group.group_epoch, h.group.metadata_version
    h.now += h.config.lease_ttl_ms
    h.apply(expire_members(h.group, ["a", "b", "never-joined"], h.now))
    assert h.group.state is GroupState.EMPTY
    assert h.group.group_epoch == epoch + 1
    assert h.group.metadata_version == version + 1
    assert h.group.target_epoch == h.group.group_epoch
    for m in h.group.members.values():
        assert m.state is MemberState.EXPIRED
        assert m.target == frozenset()
        assert m.held() == frozenset()
    assert h.group.holders() == {}
    # Idempotent: a second replica running the same timer changes nothing.
    assert expire_members(h.group, ["a", "b"], h.now).is_noop
    # Late heartbeats get UNKNOWN_MEMBER while the records are kept.
    assert h.hb("a", 1, owned=()).status is UNKNOWN
    # After retention the records are removed.
    retention = h.config.stale_member_retention_ms
    assert next_deadline_ms(h.group, h.config) == h.now + retention
    assert remove_stale_members(h.group, h.now + retention - 1, h.config).is_noop
    result = remove_stale_members(h.group, h.now + retention, h.config)
    h.apply(result)
    assert result.removed_members == {"a", "b"}
    assert not result.header_changed
    assert h.group.members == {}
    assert next_deadline_ms(h.group, h.config) is None
    # A member joining later starts a fresh assignment.
    r = h.join("c")
    assert len(r.assigned) == 4


@pytest.mark.seed("E5")
def test_partial_expiry_rebalances_the_rest() -> None:
    h = Harness()
    for mid in "abc":
        h.join(mid)
    for mid in "abc":
        h.steady(mid)
    h.apply(expire_members(h.group, ["c"], h.now))
    assert h.group.state is GroupState.ASSIGNING
    for _ in range(3):
        for mid in "ab":
            h.steady(mid)
    assert h.group.state is GroupState.STABLE
    assert sorted(len(h.member(m).assigned) for m in "ab") == [2, 2]


# -- metadata version correction (E19, E20) -----------------------------------------


@pytest.mark.seed("E19")
@pytest.mark.seed("E20")
def test_higher_metadata_version_gets_sync_metadata_which_grants_and_writes_nothing() -> None:
    h = Harness()
    h.join("a")
    before = h.group
    # Redis lost writes: the member saw metadata version 9 and epoch 7 before the loss.
    request_owned = {"orders/0@0", "orders/9@9"}
    r = h.hb("a", 1, owned=request_owned, metadata_version=9, subscriptions=["audit"])
    assert r.status is SYNC
    # No grants (what it holds was granted under metadata Redis lost: it drops every
    # shard and rejoins), no lease renewal, and nothing written at all.
    assert r.member_epoch == 0 and r.assigned == {} and r.pending == frozenset()
    assert not r.renews_lease and r.is_noop and r.group is before
    # The member rejoins (once its runs ended) and gets fresh grants, under tokens
    # above every token issued before.
    h.now += 1
    r = h.join("a")
    assert r.status is OK
    assert all(t > before.last_token for t in r.assigned.values())


@pytest.mark.seed("E19")
def test_a_member_reporting_an_epoch_above_the_group_epoch_after_a_loss_rejoins() -> None:
    h = Harness()
    h.join("a")
    tokens_seen = dict(h.member("a").assigned)
    snapshot = h.group
    for _ in range(3):  # rebalances Redis then loses
        h.join("b")
        h.steady("a")
        h.steady("b")
        h.hb("b", -1)
        h.steady("a")
        h.now += 1
        tokens_seen |= {s: max(t, tokens_seen.get(s, 0)) for s, t in h.member("a").assigned.items()}
    seen = h.member("a")
    h.group = snapshot  # the failover
    r = h.hb("a", seen.epoch, owned=seen.assigned, metadata_version=seen.epoch)
    assert r.status in (SYNC, FENCED) and r.assigned == {} and r.is_noop
    h.now += 1
    r = h.join("a")
    assert all(t > tokens_seen[s] for s, t in r.assigned.items())


@pytest.mark.seed("E20")
def test_fence_refused_after_lost_writes_quarantines_and_raises_the_token_floor() -> None:
    """Finding 4c: the member whose grant a fence of a lost grant refused is fenced with
    its shards quarantined, as at a revocation timeout, not freed at once; the refused
    shard stays quarantined for a lease TTL even after that member rejoins (the lost
    grant's owner may still run it)."""
    h = Harness(orders(2))
    h.join("a")
    h.join("b")
    settle(h, "ab")
    # Before Redis lost writes, "x" was granted b's shard under a token the metadata
    # never recorded (the fence survived on the shard's key, the metadata did not).
    [shard] = h.member("b").assigned
    lost = h.group.last_token + 500
    held_by_b = h.member("b").held()
    until = h.now + h.config.lease_ttl_ms
    refused = {shard: f"{lost}:x"}
    h.apply(
        fence_after_regression(
            h.group, "b", refused, h.now, member_until_ms=until, lost_until_ms=until
        )
    )
    b = h.member("b")
    assert b.state is MemberState.FENCED
    assert b.quarantined == held_by_b and b.quarantined_until_ms == until
    lost_record = h.member("~lost:x")
    assert lost_record.quarantined == {shard} and lost_record.quarantined_until_ms == until
    assert h.group.last_token == lost  # every token from now on is above it
    h.join("b")  # b's runs ended: it rejoins at once
    for _ in range(3):
        r = h.steady("a")
        assert shard not in r.assigned and shard in r.pending | h.member("b").target
        h.steady("b")
    assert shard not in h.member("b").assigned
    h.now = until
    h.apply(release_quarantines(h.group, h.now))
    settle(h, "ab")
    holder = next(m for m in "ab" if shard in h.member(m).assigned)
    assert h.member(holder).assigned[shard] > lost
    assert raise_token_floor(h.group, lost).is_noop
    assert raise_token_floor(h.group, h.group.last_token + 1).group.last_token > lost


def test_an_operator_reinitialised_group_issues_tokens_above_its_fences() -> None:
    group = empty_group("g", token_floor=10**15)
    assert group.group_epoch == 0 and group.last_token == 10**15
    h = Harness()
    h.group = group
    r = h.join("a")
    assert r.member_epoch == 1 and all(t > 10**15 for t in r.assigned.values())


# -- fence tokens (issue 18, finding 4d) ---------------------------------------------


@given(last=st.integers(0, 2**52), now=st.integers(0, 2**42), later=st.integers(0, 10**6))
def test_a_token_is_above_the_last_and_above_redis_time(last: int, now: int, later: int) -> None:
    token = next_token(last, now)
    assert token > last and token >= now * TOKENS_PER_MS
    # Issued later (ms), from the metadata as it was *before* this token (a loss of
    # writes put `last` back): still above it once Redis time passed the grant's.
    assert next_token(last, now + later + 1) > token or token > now * TOKENS_PER_MS
    assert parse_token(f"{token}:m") == token and parse_token("x:m") is None


def test_tokens_survive_a_loss_of_writes_when_redis_time_moved_on() -> None:
    h = Harness()
    h.join("a")
    before_loss = h.group
    h.join("b")
    settle(h, "ab")
    issued = h.group.last_token
    h.group = before_loss  # the failover lost b's join and its grants
    h.now += 2_000  # a failover takes seconds
    h.join("c")
    settle(h, "ac")
    granted = h.member("c").assigned
    assert granted and min(granted.values()) > issued


# -- request sequence numbers (issue 18, finding 3) ------------------------------------


def test_a_stale_or_duplicate_request_is_answered_from_the_record_and_acts_on_nothing() -> None:
    h, revoked = two_members_splitting_four_shards()
    kept = set(h.member("a").assigned)
    # Sequence 7 is the newest the coordinator acted on. A delayed request 6 claims
    # the revoked shards are gone: it must not complete the revocation...
    before = h.group
    r = h.hb("a", 1, owned=kept, sequence=6, last_sequence=7)
    assert r.stale and r.status is OK and r.is_noop and not r.renews_lease
    assert r.group is before and h.member("a").state is MemberState.UNREVOKED
    assert r.revoke == revoked and set(r.assigned) == kept  # the record, as it stands
    # ...nor may a duplicate of 7 (a re-send), nor a stale join replace the record.
    assert h.hb("a", 1, owned=kept, sequence=7, last_sequence=7).is_noop
    r = h.hb("a", 0, subscriptions=["orders"], owned=None, sequence=5, last_sequence=7)
    assert r.is_noop and h.member("a").epoch == 1
    # b cannot take a grant on a stale request either.
    assert h.hb("b", h.member("b").epoch, owned=(), sequence=3, last_sequence=3).assigned == {}
    # The newer request acts.
    r = h.hb("a", 1, owned=kept, sequence=8, last_sequence=7)
    assert not r.stale and r.member_epoch == 2 and r.renews_lease
    r = h.steady("b")
    assert set(r.assigned) == revoked


@pytest.mark.parametrize("status", [UNKNOWN, FENCED])
def test_a_stale_request_of_a_dead_record_is_refused_without_a_write(
    status: HeartbeatStatus,
) -> None:
    h = Harness()
    h.join("a")
    if status is UNKNOWN:
        h.apply(expire_members(h.group, ["a"], h.now))
    else:
        h.group = replace(
            h.group, members={"a": h.member("a").tombstone(MemberState.FENCED, h.now)}
        )
    before = h.group
    r = h.hb("a", 1, owned=(), sequence=1, last_sequence=4)
    assert r.status is status and r.is_noop and r.group is before


def test_a_request_without_a_sequence_is_never_stale() -> None:
    h = Harness()
    h.join("a")
    r = h.hb("a", 1, owned=h.member("a").assigned, last_sequence=10**6)
    assert not r.stale and r.renews_lease


@pytest.mark.parametrize("sequence", [0, -1, 2**53])
def test_a_sequence_out_of_range_is_invalid(sequence: int) -> None:
    with pytest.raises(InvalidHeartbeat, match="sequence"):
        heartbeat(
            Group("g"),
            orders(2),
            HeartbeatInput("a", 0, 0, frozenset({"orders"}), sequence=sequence),
            0,
            CoreConfig(),
        )


# -- subscriptions, topology, batching ------------------------------------------------


def test_subscription_change_bumps_once_and_moves_shards() -> None:
    top = Topology(
        shards={"orders": ("orders/0@0", "orders/1@0"), "audit": ("audit/0@0",)},
        versions={"orders": 1, "audit": 1},
    )
    h = Harness(top)
    h.join("a")
    epoch, version = h.group.group_epoch, h.group.metadata_version
    r = h.hb("a", 1, owned=h.member("a").assigned, subscriptions=["orders", "audit"])
    assert h.group.group_epoch == epoch + 1
    assert h.group.metadata_version == version + 1
    assert set(r.assigned) == {"orders/0@0", "orders/1@0", "audit/0@0"}
    assert h.group.topology_version == {"audit": 1, "orders": 1}
    r = h.hb("a", r.member_epoch, owned=r.assigned, subscriptions=["audit"])
    assert r.revoke == {"orders/0@0", "orders/1@0"}


def test_heterogeneous_subscriptions_get_only_their_streams() -> None:
    top = Topology(shards={"orders": ("orders/0@0",), "audit": ("audit/0@0", "audit/1@0")})
    h = Harness(top)
    h.join("a", ["orders"])
    h.join("b", ["audit"])
    h.steady("a")
    h.steady("b")
    assert set(h.member("a").assigned) == {"orders/0@0"}
    assert set(h.member("b").assigned) == {"audit/0@0", "audit/1@0"}


def test_topology_change_bumps_once_and_spreads_new_shards() -> None:
    h = Harness(orders(2), CoreConfig(assignment_interval_ms=5_000))
    h.join("a")
    h.join("b")
    h.now += 5_000
    for mid in "ab":
        h.steady(mid)
    for mid in "ab":
        h.steady(mid)
    assert h.group.state is GroupState.STABLE
    epoch = h.group.group_epoch
    h.topology = orders(4, version=2)
    h.steady("a")  # noticed: bump, but the batching interval defers the target
    assert h.group.group_epoch == epoch + 1
    h.steady("b")
    h.steady("a")
    assert h.group.group_epoch == epoch + 1  # once, not per heartbeat
    assert h.group.state is GroupState.ASSIGNING
    h.now += 5_000
    h.apply(compute_target_if_due(h.group, h.topology, h.now, h.config))
    assert h.group.target_epoch == epoch + 1
    assert h.group.topology_version == {"orders": 2}
    for mid in "ab":
        assert len(h.steady(mid).assigned) == 2


def test_batched_assignment_defers_target_and_grants() -> None:
    config = CoreConfig(assignment_interval_ms=1_000)
    h = Harness(orders(4), config)
    h.join("a")  # the first target is never deferred
    assert len(h.member("a").assigned) == 4
    h.now += 100
    r = h.join("b")
    assert h.group.state is GroupState.ASSIGNING
    assert r.member_epoch == h.group.target_epoch  # reconciled against the last target
    assert r.assigned == {}
    assert next_deadline_ms(h.group, config) == h.group.last_assignment_ms + 1_000
    assert compute_target_if_due(h.group, h.topology, h.now, config).is_noop
    h.now += 900
    result = compute_target_if_due(h.group, h.topology, h.now, config)
    h.apply(result)
    assert result.fences == ()
    assert h.group.target_epoch == h.group.group_epoch
    assert len(h.member("b").target) == 2


def test_batching_keeps_reconciling_against_the_last_target() -> None:
    config = CoreConfig(assignment_interval_ms=1_000)
    h = Harness(orders(4), config)
    h.join("a")
    h.join("b")
    h.now += 1_000
    a_grants = dict(h.member("a").assigned)
    h.steady("a")  # target computed: a must revoke two shards to b
    assert h.steady("b").pending
    h.now += 10
    h.hb("a", -1)  # a leaves instead; the next target waits for its slot
    assert h.group.state is GroupState.ASSIGNING
    r = h.steady("b")
    # b still receives what the last target gave it, under a token strictly above
    # a's: every grant takes a token above every earlier one.
    assert len(r.assigned) == 2
    assert r.pending == frozenset()
    for shard in r.assigned:
        owner, token = h.fences[shard]
        assert owner == "b"
        assert token > a_grants[shard]
    h.now += 1_000
    r = h.steady("b")
    assert len(r.assigned) == 4
    assert h.group.state is GroupState.STABLE


def test_fence_repair_regrants_under_a_fresh_token() -> None:
    h = Harness(orders(2))
    h.join("a")
    h.join("b")
    h.steady("a")
    h.steady("b")
    h.steady("a")
    a = h.member("a")
    shard = next(iter(a.assigned))
    old = a.assigned[shard]
    h.now += 1
    r = h.hb("a", a.epoch, owned=a.assigned, fence_failed=[shard, "orders/9@9"])
    fresh = h.now * TOKENS_PER_MS
    assert [(f.shard, f.member_id, f.token) for f in r.fences] == [(shard, "a", fresh)]
    assert r.assigned[shard] == fresh > old and h.group.last_token == fresh
    assert r.changed_members == {"a"}
    # Reported again (the fence write was lost, say): again a fresh, higher token.
    r = h.hb("a", a.epoch, owned=a.assigned, fence_failed=[shard])
    assert r.fences[0].token == fresh + 1


def test_held_grants_leave_new_shards_pending_and_repairs_waiting() -> None:
    h = Harness(orders(4))
    r = h.hb("a", 0, subscriptions=["orders"], hold_grants=True)
    assert r.status is OK and r.renews_lease
    assert r.assigned == {} and r.pending == set(h.topology.shards["orders"])
    assert r.fences == () and h.group.last_token == 0
    assert h.member("a").state is MemberState.UNRELEASED
    r = h.hb("a", r.member_epoch, owned=(), fence_failed=["orders/0@0"], hold_grants=True)
    assert r.assigned == {} and r.fences == ()
    r = h.hb("a", r.member_epoch, owned=())  # settled: granted
    assert len(r.assigned) == 4 and len(r.fences) == 4


def test_rebalance_timeout_from_request_arms_the_deadline() -> None:
    h = Harness()
    r = heartbeat(
        h.group,
        h.topology,
        HeartbeatInput("a", 0, 0, frozenset({"orders"}), rebalance_timeout_ms=5_000),
        h.now,
        h.config,
    )
    h.apply(r)
    h.join("b")
    h.hb("a", 1, owned=h.member("a").assigned)
    assert h.member("a").revocation_deadline_ms == h.now + 5_000

"""Reconciliation of one member (port of KIP-848 ``CurrentAssignmentBuilder``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamworks.coordinator.core import Member, MemberState
from streamworks.coordinator.core import reconcile_member as reconcile_with_token

NOW = 5_000
TIMEOUT = 60_000


def member(
    *,
    epoch: int = 3,
    previous_epoch: int = 2,
    state: MemberState = MemberState.STABLE,
    assigned: Mapping[str, int] | None = None,
    pending_revocation: frozenset[str] = frozenset(),
    target: frozenset[str] = frozenset(),
    deadline: int | None = None,
) -> Member:
    return Member(
        member_id="me",
        epoch=epoch,
        previous_epoch=previous_epoch,
        state=state,
        subscriptions=frozenset({"s"}),
        assigned=assigned or {},
        pending_revocation=pending_revocation,
        target=target,
        revocation_deadline_ms=deadline,
        rebalance_timeout_ms=TIMEOUT,
        client={},
        joined_at_ms=0,
        expired_at_ms=None,
    )


def reconcile_member(
    m: Member,
    target_epoch: int,
    target: frozenset[str],
    owned: frozenset[str] | None,
    holders: Mapping[str, str],
    now_ms: int,
) -> Member:
    """Reconcile, granting under the target epoch as fence token (tokens only have to
    be above every earlier one; ``test_heartbeat.py`` checks where they come from)."""
    return reconcile_with_token(m, target_epoch, target, owned, holders, now_ms, target_epoch)


def shards(*indexes: int) -> frozenset[str]:
    return frozenset(f"s/{i}@0" for i in indexes)


def grants(epoch: int, *indexes: int) -> dict[str, int]:
    return {f"s/{i}@0": epoch for i in indexes}


def test_stable_at_target_epoch_is_returned_unchanged() -> None:
    m = member(epoch=4, assigned=grants(2, 1), target=shards(1))
    assert reconcile_member(m, 4, shards(1, 2), None, {}, NOW) is m


def test_gaining_free_shards_jumps_to_target_epoch() -> None:
    m = member(epoch=3, assigned=grants(2, 1), target=shards(1, 2))
    out = reconcile_member(m, 5, shards(1, 2), shards(1), {"s/1@0": "me"}, NOW)
    assert out.state is MemberState.STABLE
    assert out.epoch == 5
    assert out.previous_epoch == 3
    # Kept shards keep their grant epoch; new ones get the new member epoch.
    assert out.assigned == {"s/1@0": 2, "s/2@0": 5}
    assert out.revocation_deadline_ms is None


def test_shard_held_by_another_member_stays_unreleased() -> None:
    m = member(epoch=3, target=shards(1, 2))
    out = reconcile_member(m, 5, shards(1, 2), frozenset(), {"s/2@0": "other"}, NOW)
    assert out.state is MemberState.UNRELEASED
    assert out.epoch == 5
    assert out.assigned == grants(5, 1)


def test_unreleased_retries_and_becomes_stable_once_released() -> None:
    m = member(epoch=5, state=MemberState.UNRELEASED, assigned=grants(5, 1), target=shards(1, 2))
    held = reconcile_member(m, 5, shards(1, 2), shards(1), {"s/2@0": "other"}, NOW)
    assert held is m
    out = reconcile_member(m, 5, shards(1, 2), shards(1), {}, NOW + 1)
    assert out.state is MemberState.STABLE
    assert out.assigned == {"s/1@0": 5, "s/2@0": 5}
    assert out.epoch == 5
    assert out.previous_epoch == m.previous_epoch  # the epoch did not change


def test_revoke_before_assign() -> None:
    m = member(epoch=3, assigned=grants(3, 1, 2), target=shards(1, 2))
    out = reconcile_member(m, 6, shards(1, 3), shards(1, 2), {}, NOW)
    assert out.state is MemberState.UNREVOKED
    assert out.epoch == 3  # frozen until the member acknowledges
    assert out.pending_revocation == shards(2)
    assert out.assigned == grants(3, 1)  # s/3 is free but NOT granted in this step
    assert out.revocation_deadline_ms == NOW + TIMEOUT


def test_revocation_already_done_by_the_member_is_skipped() -> None:
    m = member(epoch=3, assigned=grants(3, 1, 2))
    out = reconcile_member(m, 6, shards(1, 3), shards(1), {}, NOW)
    assert out.state is MemberState.STABLE
    assert out.assigned == {"s/1@0": 3, "s/3@0": 6}
    assert out.pending_revocation == frozenset()


def test_unknown_ownership_means_revocation_is_needed() -> None:
    m = member(epoch=3, assigned=grants(3, 1, 2))
    out = reconcile_member(m, 6, shards(1), None, {}, NOW)
    assert out.state is MemberState.UNREVOKED


@pytest.mark.parametrize("owned", [None, shards(2), shards(7, 2)])
def test_unrevoked_waits_for_acknowledgement(owned: frozenset[str] | None) -> None:
    m = member(
        epoch=3,
        state=MemberState.UNREVOKED,
        assigned=grants(3, 1),
        pending_revocation=shards(2),
        target=shards(1, 3),
        deadline=NOW + 10,
    )
    assert reconcile_member(m, 6, shards(1, 3), owned, {}, NOW + 5) is m


def test_acknowledged_revocation_moves_to_target_epoch_and_grants() -> None:
    m = member(
        epoch=3,
        state=MemberState.UNREVOKED,
        assigned=grants(3, 1),
        pending_revocation=shards(2),
        deadline=NOW + 10,
    )
    # The member's own revoked shard in ``holders`` does not block it.
    out = reconcile_member(m, 6, shards(1, 3), shards(1), {"s/1@0": "me", "s/2@0": "me"}, NOW)
    assert out.state is MemberState.STABLE
    assert out.epoch == 6
    assert out.previous_epoch == 3
    assert out.assigned == {"s/1@0": 3, "s/3@0": 6}
    assert out.pending_revocation == frozenset()
    assert out.revocation_deadline_ms is None


def test_acknowledged_revocation_with_more_to_revoke_takes_epoch_plus_one() -> None:
    # The target moved on while the member was revoking: it must revoke s/1 too.
    m = member(
        epoch=3,
        state=MemberState.UNREVOKED,
        assigned=grants(3, 1),
        pending_revocation=shards(2),
        deadline=NOW + 10,
    )
    out = reconcile_member(m, 8, shards(4), shards(1), {}, NOW + 3)
    assert out.state is MemberState.UNREVOKED
    assert out.epoch == 4
    assert out.pending_revocation == shards(1)
    assert out.assigned == {}
    assert out.revocation_deadline_ms == NOW + 3 + TIMEOUT  # re-armed for the new round


def test_shard_pending_revocation_elsewhere_is_not_granted() -> None:
    m = member(epoch=3)
    out = reconcile_member(m, 6, shards(1), frozenset(), {"s/1@0": "draining"}, NOW)
    assert out.state is MemberState.UNRELEASED
    assert out.assigned == {}


@pytest.mark.parametrize("state", [MemberState.FENCED, MemberState.EXPIRED])
def test_dead_members_cannot_be_reconciled(state: MemberState) -> None:
    with pytest.raises(ValueError, match="cannot reconcile"):
        reconcile_member(member(state=state), 6, shards(1), None, {}, NOW)


# -- properties ---------------------------------------------------------------

SHARDS = [f"s/{i}@0" for i in range(6)]
shard_sets = st.frozensets(st.sampled_from(SHARDS))


@st.composite
def live_members(draw: st.DrawFn) -> Member:
    state = draw(
        st.sampled_from([MemberState.STABLE, MemberState.UNREVOKED, MemberState.UNRELEASED])
    )
    epoch = draw(st.integers(1, 10))
    pending = frozenset()
    if state is MemberState.UNREVOKED:  # an UNREVOKED member always has something to revoke
        pending = draw(st.frozensets(st.sampled_from(SHARDS), min_size=1))
    assigned_set = draw(shard_sets) - pending
    return member(
        epoch=epoch,
        previous_epoch=draw(st.integers(0, epoch)),
        state=state,
        assigned={s: draw(st.integers(1, epoch)) for s in sorted(assigned_set)},
        pending_revocation=pending,
        target=draw(shard_sets),
        deadline=NOW if state is MemberState.UNREVOKED else None,
    )


@settings(max_examples=400, deadline=None)
@given(
    m=live_members(),
    target_bump=st.integers(0, 5),
    target=shard_sets,
    owned=st.none() | shard_sets,
    holders=st.dictionaries(st.sampled_from(SHARDS), st.sampled_from(["me", "x", "y"])),
)
def test_reconcile_invariants(
    m: Member,
    target_bump: int,
    target: frozenset[str],
    owned: frozenset[str] | None,
    holders: dict[str, str],
) -> None:
    target_epoch = m.epoch + target_bump
    # Reachable states only: at its target epoch a STABLE member holds exactly its
    # target and an UNRELEASED one a part of it.
    if target_bump == 0 and m.state is MemberState.STABLE:
        target = frozenset(m.assigned)
    if target_bump == 0 and m.state is MemberState.UNRELEASED:
        target |= frozenset(m.assigned)
    m = replace(m, target=target)
    out = reconcile_member(m, target_epoch, target, owned, holders, NOW + 1)
    new = set(out.assigned) - set(m.assigned)
    # Epochs never go backwards nor beyond the target epoch.
    assert m.epoch <= out.epoch <= max(target_epoch, m.epoch + 1)
    assert out.previous_epoch in (m.previous_epoch, m.epoch)
    # Nothing outside the target is ever granted; kept shards keep their grant epoch.
    assert set(out.assigned) <= target | set(m.assigned)
    for shard in set(out.assigned) & set(m.assigned):
        assert out.assigned[shard] == m.assigned[shard]
    for shard in new:
        assert holders.get(shard, "me") == "me", "granted a shard another member holds"
        assert out.assigned[shard] == out.epoch == target_epoch
    # Revoke before assign: a step that (still) revokes grants nothing.
    if out.state is MemberState.UNREVOKED:
        assert not new
        assert out.pending_revocation
        assert out.revocation_deadline_ms is not None
    else:
        assert out.pending_revocation == frozenset()
        assert out.revocation_deadline_ms is None
        assert set(out.assigned) <= target
    # The epoch is frozen while shards to revoke are still reported.
    if m.state is MemberState.UNREVOKED and (owned is None or owned & m.pending_revocation):
        assert out is m
    if out.state is MemberState.STABLE:
        assert set(out.assigned) == target
        assert out.epoch == target_epoch
    # Reconciling again with nothing new is a fixpoint.
    if out.state is not MemberState.UNREVOKED and owned is not None:
        again = reconcile_member(out, target_epoch, target, owned, holders, NOW + 2)
        assert again == out

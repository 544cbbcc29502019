"""Migration decisions (pure): scale-out, scale-in, routing fence, retirement."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamworks.coordinator.core.migrations import (
    MigrationPhase,
    activate,
    due_for_drain_check,
    migration_phase,
    retire_shards,
    scale,
)
from streamworks.coordinator.core.streams import ShardState, StreamMeta, new_stream, topology_of

LEASE = 30_000


def ids(meta: StreamMeta, state: ShardState) -> list[str]:
    return [s.shard_id(meta.name) for s in meta.shards if s.state is state]


def test_scale_out_records_new_shards_provisioning_first() -> None:
    """Issue 18, finding 5: the new shards are committed before their keys exist, and
    neither routed to nor assigned until the scale-out activates them."""
    before = new_stream("orders", 4, 0)
    meta = scale(before, 6, 1_000, LEASE)
    assert ids(meta, ShardState.PROVISIONING) == ["orders/4@1", "orders/5@1"]
    assert meta.routable() == before.routable() and meta.assignable() == before.assignable()
    assert (meta.routing_version, meta.layout_version) == (1, 1)
    with pytest.raises(ValueError, match="provisioned"):
        scale(meta, 8, 1_000, LEASE)  # the shell finishes the first scale-out first
    assert activate(before) is before


def test_scale_out_adds_shards_under_a_new_incarnation() -> None:
    meta = activate(scale(new_stream("orders", 4, 0), 6, 1_000, LEASE))
    assert [s.shard_id("orders") for s in meta.routable()] == [
        "orders/0@0",
        "orders/1@0",
        "orders/2@0",
        "orders/3@0",
        "orders/4@1",
        "orders/5@1",
    ]
    assert meta.routing_version == 2 and meta.layout_version == 2
    assert migration_phase(meta, 1_000) is MigrationPhase.NONE
    assert meta.migration is not None and meta.migration["created"] == ["orders/4@1", "orders/5@1"]


@pytest.mark.seed("E9")
def test_scale_in_drains_then_checks_after_the_routing_fence_without_any_member() -> None:
    meta = scale(new_stream("orders", 10, 0), 1, 5_000, LEASE)
    assert meta.shard_count == 1
    assert ids(meta, ShardState.DRAINING) == [f"orders/{i}@0" for i in range(1, 10)]
    assert [s.shard_id("orders") for s in meta.assignable()][-1] == "orders/9@0"  # still assignable
    assert migration_phase(meta, 5_000 + LEASE - 1) is MigrationPhase.FENCING
    assert due_for_drain_check(meta, 5_000 + LEASE - 1) == []
    # Time alone moves the migration on: no member has to heartbeat (E9, E10).
    assert migration_phase(meta, 5_000 + LEASE) is MigrationPhase.DRAINING
    assert len(due_for_drain_check(meta, 5_000 + LEASE)) == 9


@pytest.mark.seed("E14")
def test_scale_in_to_zero_routes_nothing_and_still_drains() -> None:
    meta = scale(new_stream("orders", 4, 0), 0, 0, LEASE)
    assert meta.shard_count == 0 and meta.routable() == []
    assert len(meta.assignable()) == 4
    meta = retire_shards(meta, ids(meta, ShardState.DRAINING), LEASE)
    assert meta.assignable() == [] and migration_phase(meta, LEASE) is MigrationPhase.NONE
    assert meta.migration is not None and meta.migration["completed_ms"] == LEASE


def test_retirement_removes_shards_from_the_layout_and_completes() -> None:
    meta = scale(new_stream("orders", 3, 0), 1, 0, LEASE)
    version = meta.layout_version
    meta = retire_shards(meta, ["orders/1@0"], LEASE)
    assert meta.layout_version == version + 1
    assert migration_phase(meta, LEASE) is MigrationPhase.DRAINING  # 2@0 still drains
    meta = retire_shards(meta, ["orders/2@0"], LEASE)
    assert migration_phase(meta, LEASE) is MigrationPhase.NONE
    topology = topology_of({"orders": meta})
    assert topology.shards_of("orders") == ("orders/0@0",)


def test_scale_out_during_a_draining_scale_in_uses_new_keys() -> None:
    meta = scale(new_stream("orders", 8, 0), 3, 0, LEASE)
    meta = activate(scale(meta, 12, 1_000, LEASE))
    routable = [s.shard_id("orders") for s in meta.routable()]
    assert len(routable) == 12 and routable[:3] == ["orders/0@0", "orders/1@0", "orders/2@0"]
    assert all(r.endswith("@1") for r in routable[3:])
    draining = ids(meta, ShardState.DRAINING)
    assert draining == [f"orders/{i}@0" for i in range(3, 8)]
    assert not set(draining) & set(routable)  # no key collision


def test_same_count_is_refused() -> None:
    with pytest.raises(ValueError, match="already has 4 shards"):
        scale(new_stream("orders", 4, 0), 4, 0, LEASE)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["scale", "retire", "wait"]), st.integers(0, 12)), max_size=25
    )
)
def test_layout_invariants_hold_under_any_sequence(ops: list[tuple[str, int]]) -> None:
    meta = new_stream("s", 4, 0)
    now = 0
    seen: set[str] = set(meta.shard_ids())
    ever: set[str] = set(seen)  # every shard id the stream ever had
    incarnation = meta.next_incarnation
    routing = meta.routing_version
    for op, n in ops:
        states = {s.shard_id("s"): s.state for s in meta.shards}
        if op == "scale":
            if n == meta.shard_count:
                continue
            before_draining = set(ids(meta, ShardState.DRAINING))
            meta = scale(meta, n, now, LEASE)
            # Not routed, not assigned before the shell activates them (keys exist).
            assert not {s.index for s in meta.provisioning()} & {s.index for s in meta.routable()}
            meta = activate(meta)
            assert meta.routing_version == routing + 1
            routing = meta.routing_version
            assert meta.shard_count == n
            assert before_draining <= set(ids(meta, ShardState.DRAINING)) | set(
                ids(meta, ShardState.RETIRED)
            )
            fence = int((meta.migration or {}).get("routing_fence_ms", 0))
            if set(ids(meta, ShardState.DRAINING)) - before_draining:
                # A scale-in: no producer may hold the old routing after the fence.
                assert fence >= now + LEASE
        elif op == "retire":
            due = due_for_drain_check(meta, now)
            meta = retire_shards(meta, [s.shard_id("s") for s in due[: n + 1]], now)
        else:
            now += n * 5_000
        # Routable shards have indexes 0..count-1, exactly once each.
        assert [s.index for s in meta.routable()] == list(range(meta.shard_count))
        all_ids = meta.shard_ids()
        assert len(all_ids) == len(set(all_ids))
        # A key is never reused, although retired records are pruned: a shard id that
        # left the record never comes back, and new ones were never seen before.
        assert not (set(all_ids) - seen) & ever
        assert not (ever - set(all_ids)) & set(all_ids)
        # Only a shard that drained leaves the record, never a routable one.
        gone = seen - set(all_ids)
        assert all(states[g] is not ShardState.ACTIVE for g in gone), gone
        ever |= set(all_ids)
        seen = set(all_ids)
        assert all(s.incarnation < meta.next_incarnation for s in meta.shards)
        assert meta.next_incarnation >= incarnation  # incarnations only grow
        incarnation = meta.next_incarnation
        if not ids(meta, ShardState.DRAINING):
            # Migration complete: no RETIRED record is kept, the record is its layout.
            assert not ids(meta, ShardState.RETIRED)
            assert len(meta.shards) == meta.shard_count
        assert (migration_phase(meta, now) is MigrationPhase.NONE) == (
            not ids(meta, ShardState.DRAINING)
        )
        assert StreamMeta.from_dict(meta.to_dict()) == meta

"""The dashboard's view building (pure): the shard map, what a draining shard waits
for, and the sparklines."""

from __future__ import annotations

import re

from streamworks.coordinator.dashboard.views import build_page, sparkline
from streamworks.coordinator.observation import Observation, Sample
from streamworks.protocol.control import (
    GroupInfo,
    MemberInfo,
    ShardGroupInfo,
    ShardInfo,
    StatusResponse,
    StreamInfo,
)


def _member(
    member_id: str, state: str, assigned: list[str], revoking: tuple[str, ...] = ()
) -> MemberInfo:
    return MemberInfo(
        member_id=member_id,
        epoch=3,
        state=state,
        assigned=assigned,
        pending_revocation=list(revoking),
        target=assigned,
        lease_expires_in_ms=1500,
        client={"host": "h", "pid": member_id[-1]},
    )


def _observation(phase: str, migration_extra: dict[str, object] | None = None) -> Observation:
    shards = [
        ShardInfo(
            shard="orders/0@0",
            state="ACTIVE",
            length=10,
            groups=[ShardGroupInfo(group="g", pending=0, lag=0)],
        ),
        ShardInfo(
            shard="orders/1@0",
            state="DRAINING",
            length=5,
            groups=[ShardGroupInfo(group="g", pending=2, lag=None)],
        ),
    ]
    migration: dict[str, object] = {
        "from": 2,
        "to": 1,
        "started_ms": 10_000,
        "routing_fence_ms": 13_000,
        "draining": ["orders/1@0"],
        "phase": phase,
        **(migration_extra or {}),
    }
    stream = StreamInfo(
        name="orders",
        shard_count=1,
        routing_version=2,
        protocol="p",
        shards=shards,
        migration=migration,
    )
    group = GroupInfo(
        group="g",
        state="STABLE",
        group_epoch=3,
        target_epoch=3,
        metadata_version=3,
        subscriptions=["orders"],
        members=[
            _member("m1", "STABLE", ["orders/0@0"]),
            _member("m2", "UNREVOKED", [], revoking=("orders/1@0",)),
            _member("m3", "EXPIRED", []),
        ],
    )
    status = StatusResponse(streams=[stream], groups=[group])
    return Observation(taken=0.0, now_ms=11_500, status=status, dead_letters={("g", "orders"): 4})


def test_the_shard_map_shows_owners_and_revoking_members() -> None:
    page = build_page(_observation("FENCING"), lambda g, s: [], "r")
    (group,) = page.groups
    assert group.live == 2
    assert [m.member_id for m in group.members] == ["m1", "m2", "m3"]
    assert group.members[2].colour is None and group.members[2].lease_s is None
    (shard_map,) = group.maps
    first, second = shard_map.cells
    assert first.owner is not None and first.owner.member_id == "m1"
    assert second.owner is None and second.revoking is not None
    assert second.revoking.member_id == "m2"
    assert page.dead_letters[0].entries == 4


def test_a_fencing_shard_waits_for_the_routing_fence() -> None:
    page = build_page(_observation("FENCING"), lambda g, s: [], "r")
    (migration,) = page.migrations
    assert migration.fence_in_s == 1.5 and migration.started_s == 1.5
    (draining,) = migration.draining
    assert draining.shard == "orders/1@0"
    assert draining.waits_for == [
        "routing fence: producers may still hold the old routing (1.5 s left)"
    ]


def test_a_draining_shard_waits_for_its_evidence() -> None:
    blocked = {"blocked": {"orders/1@0": "group g: pending 2"}}
    page = build_page(_observation("DRAINING", blocked), lambda g, s: [], "r")
    (draining,) = page.migrations[0].draining
    assert draining.waits_for == [
        "last drain check: group g: pending 2",
        "group g: lag unknown (Redis reports nil)",
        "group g: 2 pending (not acknowledged)",
    ]


def test_no_migration_when_nothing_drains() -> None:
    assert build_page(_observation("NONE"), lambda g, s: [], "r").migrations == []


def test_a_failed_observation_is_an_error_banner() -> None:
    page = build_page(Observation(0.0, 0, None, error="status unavailable: X"), dict.get, "r")
    assert page.error == "status unavailable: X" and page.groups == []


def _points(svg: str, kind: str) -> list[tuple[float, float]]:
    found = re.search(rf'class="{kind}" points="([^"]*)"', svg)
    assert found is not None
    return [(float(x), float(y)) for x, y in (p.split(",") for p in found.group(1).split())]


def test_sparklines_scale_to_the_largest_value() -> None:
    assert sparkline([]) == ""
    one = str(sparkline([Sample(0, 3, 5)]))
    assert len(_points(one, "lag")) == 2  # a flat line, not a dot
    samples = [Sample(i, pending=i, lag=None if i == 2 else 10 - i) for i in range(5)]
    svg = str(sparkline(samples, width=100, height=24))
    lag, pending = _points(svg, "lag"), _points(svg, "pending")
    assert [x for x, _ in lag] == [0, 25, 50, 75, 100]
    assert lag[0][1] == 1.0  # the largest value (10) at the top
    assert lag[2][1] == 23.0 and pending[0][1] == 23.0  # nil and 0 at the bottom
    assert all(0 <= y <= 24 for _, y in lag + pending)

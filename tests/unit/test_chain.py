"""``chain``: one commit for several heartbeat steps applied in turn (group commit).
What it writes, applied to the group the first step started from, gives exactly the
group the last step ended with."""

from __future__ import annotations

import pytest

from streamworks.coordinator.core import CoreConfig, Group, HeartbeatInput, Topology, heartbeat
from streamworks.coordinator.core.changes import GroupChange, apply_delta, chain

TOPOLOGY = Topology(
    shards={"orders": tuple(f"orders/{i}@0" for i in range(6))}, versions={"orders": 1}
)
CONFIG = CoreConfig(assignment_interval_ms=0)


def join(member_id: str) -> HeartbeatInput:
    return HeartbeatInput(member_id, 0, 0, subscriptions=frozenset({"orders"}))


def steps_of(group: Group, requests: list[HeartbeatInput]) -> list[GroupChange]:
    steps: list[GroupChange] = []
    for request in requests:
        step = heartbeat(group, TOPOLOGY, request, 1_000, CONFIG)
        steps.append(step)
        group = step.group
    return steps


def replayed(original: Group, change: GroupChange) -> Group:
    """The group a commit of ``change`` leaves in Redis, read back by another replica."""
    header = change.group.to_header() if change.header_changed else None
    upserts = [
        change.group.members[m] for m in change.changed_members if m not in change.removed_members
    ]
    return apply_delta(original, header, upserts, change.removed_members)


def test_a_chain_writes_every_change_once_and_replays_to_the_last_group() -> None:
    original = steps_of(Group("g"), [join("a")])[-1].group
    a_epoch = original.members["a"].epoch
    steps = steps_of(
        original,
        [
            join("b"),
            join("c"),
            HeartbeatInput("a", a_epoch, original.metadata_version, owned=frozenset()),
            HeartbeatInput("c", -1, 0),  # c leaves again within the batch
        ],
    )
    change = chain(original, steps)
    assert change.group is steps[-1].group
    assert change.changed_members == {"a", "b", "c"}
    assert change.removed_members == {"c"}  # written by one step, deleted by a later one
    assert change.header_changed
    assert change.fences == tuple(f for s in steps for f in s.fences)  # in step order
    assert replayed(original, change) == change.group


def test_a_chain_of_nothing_changes_nothing() -> None:
    original = Group("g")
    change = chain(original, [])
    assert change.group is original and change.is_noop


def test_steps_of_another_group_are_refused() -> None:
    with pytest.raises(ValueError):
        chain(Group("g"), steps_of(Group("h"), [join("a")]))

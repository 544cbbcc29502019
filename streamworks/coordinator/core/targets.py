"""When and how the group's target assignment is recomputed.

The target is computed lazily (KIP-848 §3): a change of membership, subscriptions
or a subscribed stream's layout bumps the group epoch, and the next step that
finds ``group_epoch > target_epoch`` runs the assignor over the live members,
stores each member's part in its record and sets ``target_epoch = group_epoch``.
With ``assignment_interval_ms > 0`` that computation is batched: at most one per
interval, so a join storm costs one assignment, not one per join.
"""

from __future__ import annotations

from dataclasses import replace

from streamworks.coordinator.core.assignor import assign_uniform
from streamworks.coordinator.core.changes import GroupEdit
from streamworks.coordinator.core.model import CoreConfig, Group, Topology

__all__ = ("assignment_due", "compute_target", "note_topology_change", "target_due")


def note_topology_change(edit: GroupEdit, topology: Topology) -> bool:
    """Bump the group epoch if a stream the target was computed from changed layout.

    Only when no recomputation is pending already: the pending one will read the
    new layout anyway, so a topology change bumps the epoch once, not on every
    heartbeat until the target catches up.

    Returns:
        True if the epoch was bumped.
    """
    if edit.group_epoch != edit.target_epoch:
        return False
    changed = any(topology.version_of(s) != v for s, v in edit.topology_version.items())
    if changed and any(m.is_live for m in edit.members.values()):
        edit.bump()
        return True
    return False


def target_due(edit: GroupEdit, now_ms: int, config: CoreConfig) -> bool:
    """Whether a new target must be computed now.

    A target is due when the group epoch is ahead of the target epoch and the
    batching interval (if any) has passed since the last computation. The very first
    target is never deferred, so no member is ever answered with epoch 0.
    """
    if edit.group_epoch <= edit.target_epoch:
        return False
    if config.assignment_interval_ms == 0 or edit.target_epoch == 0:
        return True
    elapsed = now_ms - edit.last_assignment_ms
    # A clock that went backwards (failover to a replica with another clock) must not
    # postpone assignment until it catches up.
    return elapsed >= config.assignment_interval_ms or elapsed < 0


def assignment_due(group: Group, now_ms: int, config: CoreConfig) -> bool:
    """Whether the next step on ``group`` at ``now_ms`` computes a new target (so it
    changes the group: a shell deciding on a cached group for a no-change answer can
    skip the step, which would run the assignor only to have its result discarded)."""
    return target_due(GroupEdit(group), now_ms, config)


def compute_target(edit: GroupEdit, topology: Topology, now_ms: int) -> None:
    """Run the assignor over the live members and record the new target.

    Each member's part is stored in its own record (only changed records are
    rewritten); the header records the target epoch, the time and the layout
    versions of every subscribed stream.
    """
    live = edit.live_members()
    subscriptions = {mid: m.subscriptions for mid, m in live.items()}
    previous = {mid: m.target for mid, m in live.items()}
    for mid, shards in assign_uniform(subscriptions, topology, previous).items():
        if live[mid].target != shards:
            edit.put(replace(live[mid], target=shards))
    streams = set().union(*subscriptions.values()) if subscriptions else set()
    edit.topology_version = {s: topology.version_of(s) for s in sorted(streams)}
    edit.target_epoch = edit.group_epoch
    edit.last_assignment_ms = now_ms

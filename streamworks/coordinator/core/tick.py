"""One pass of the event loop over a group: every timer step, in order, as one change.

Expire members whose lease passed (E5), fence members past their revocation
deadline (E6, E8; their shards stay quarantined until their lease would have
expired), release quarantines that are due, drop stale tombstones, and compute a
pending target. The steps
are applied one after another and their change sets merged, so the shell commits
the whole pass at once (or nothing, when nothing was due).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from streamworks.coordinator.core.changes import TimerResult
from streamworks.coordinator.core.model import CoreConfig, Group, Topology
from streamworks.coordinator.core.timers import (
    compute_target_if_due,
    expire_members,
    fence_overdue_revocations,
    release_quarantines,
    remove_stale_members,
)

__all__ = ("tick",)


def tick(
    group: Group,
    expired_ids: Iterable[str],
    topology: Topology,
    now_ms: int,
    config: CoreConfig,
) -> TimerResult:
    """Apply every due timer step to ``group``; the result's change sets cover all."""
    original = group
    changed: set[str] = set()
    header_changed = False
    steps: tuple[Callable[[Group], TimerResult], ...] = (
        lambda g: expire_members(g, expired_ids, now_ms),
        lambda g: fence_overdue_revocations(g, now_ms, config),
        lambda g: release_quarantines(g, now_ms),
        lambda g: remove_stale_members(g, now_ms, config),
        lambda g: compute_target_if_due(g, topology, now_ms, config),
    )
    for step in steps:
        result = step(group)
        changed |= result.changed_members
        header_changed = header_changed or result.header_changed
        group = result.group
    final_changed = frozenset(m for m in changed if original.members.get(m) != group.members.get(m))
    removed = frozenset(m for m in final_changed if m not in group.members)
    return TimerResult(group, final_changed, removed, header_changed, ())

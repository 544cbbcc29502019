"""The coordinator's pure core: state, assignor, reconciliation, heartbeat, timers.

No I/O and no clock: every function takes the state, the input and ``now_ms``
(Redis server time, integer milliseconds) and returns the new state plus what to
write. The store, service, HTTP API and event loop are thin shells around it.
"""

from __future__ import annotations

from streamworks.coordinator.core.assignor import assign_uniform
from streamworks.coordinator.core.changes import GroupChange, TimerResult
from streamworks.coordinator.core.heartbeat import (
    HeartbeatInput,
    HeartbeatResult,
    HeartbeatStatus,
    InvalidHeartbeat,
    heartbeat,
)
from streamworks.coordinator.core.model import (
    CoreConfig,
    FenceWrite,
    Group,
    GroupState,
    Member,
    MemberState,
    Topology,
    stream_of,
)
from streamworks.coordinator.core.reconcile import reconcile_member
from streamworks.coordinator.core.timers import (
    compute_target_if_due,
    expire_members,
    fence_overdue_revocations,
    next_deadline_ms,
    raise_token_floor,
    release_quarantines,
    remove_stale_members,
)

__all__ = (
    "CoreConfig",
    "FenceWrite",
    "Group",
    "GroupChange",
    "GroupState",
    "HeartbeatInput",
    "HeartbeatResult",
    "HeartbeatStatus",
    "InvalidHeartbeat",
    "Member",
    "MemberState",
    "TimerResult",
    "Topology",
    "assign_uniform",
    "compute_target_if_due",
    "expire_members",
    "fence_overdue_revocations",
    "heartbeat",
    "next_deadline_ms",
    "raise_token_floor",
    "reconcile_member",
    "release_quarantines",
    "remove_stale_members",
    "stream_of",
)

"""The coordinator's protocol steps, for a history recorder (``protocol/history.py``).

One call at each hook point of the store; each returns after one ``is None`` check
when nothing records (the default).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamworks.coordinator.core import FenceWrite
from streamworks.coordinator.core.streams import ShardState, StreamMeta
from streamworks.protocol import history

__all__ = ("fences_answered", "group_committed", "stream_committed")


def fences_answered(
    group_id: str, fences: Sequence[FenceWrite], replies: Sequence[Any], at: float | None
) -> None:
    """The owner-fence writes of ``fences`` sent at ``at`` were answered ``replies``
    (``fence.lua``: 1 written, 0 or 2 not; -2 the shard is gone, nothing to record)."""
    sink = history.sink
    if sink is None:
        return
    for fence, reply in zip(fences, replies, strict=True):
        if reply[0] != -2:
            sink.fence(
                group=group_id,
                shard=fence.shard,
                token=fence.token,
                member=fence.member_id,
                written=reply[0] == 1,
                at=at,
            )


def stream_committed(meta: StreamMeta, revision: int, at: float | None) -> None:
    """A stream's layout was committed at ``revision`` (sent at ``at``): its migration
    phase as the layout says it (PROVISIONING, DRAINING, NONE) and the shards in it."""
    sink = history.sink
    if sink is None:
        return
    sink.commit(stream=meta.name, revision=revision, at=at)
    for state in (ShardState.PROVISIONING, ShardState.DRAINING):
        moving = [s.shard_id(meta.name) for s in meta.shards if s.state is state]
        if moving:
            sink.migration(stream=meta.name, phase=state.value, shards=moving, at=at)
            return
    retired = [s.shard_id(meta.name) for s in meta.shards if s.state is ShardState.RETIRED]
    sink.migration(stream=meta.name, phase="NONE", shards=retired, at=at)


def group_committed(group_id: str, revision: int, at: float | None) -> None:
    """A group's metadata was committed at ``revision`` (sent at ``at``)."""
    sink = history.sink
    if sink is not None:
        sink.commit(group=group_id, revision=revision, at=at)

"""What ``TestRuntime.wait_assigned`` waits for when the app has schedules: one running
worker runs them, and each has planned its next tick. So ``rt.advance`` right after
the runtime started makes the schedules tick: a schedule opened only after the jump
would start at the new time, owing nothing for the time jumped over."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamworks.coordinator.service import CoordinatorService
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.runtime.worker import Worker

__all__ = ("schedules_problem",)


async def schedules_problem(
    service: CoordinatorService, redis: Any, keyspace: Keyspace, workers: Sequence[Worker]
) -> str | None:
    """Why the app's schedules are not running yet (None: they are)."""
    running = [w for w in workers if w.scheduler is not None and w.scheduler.runners]
    if len(running) != 1:
        return f"schedules run by {len(running)} workers"
    [runner] = running[0].scheduler.runners.values()  # type: ignore[union-attr]
    if not runner.accepting:
        return "the schedule runner is stopping"
    info = await service.stream_info(Keyspace.SCHEDULE_STREAM)
    shard = ShardId.parse(info.shards[0].shard)
    group = running[0].group
    for name in running[0].app.schedules:
        if not await redis.hexists(keyspace.schedule_state(shard, group, name), "next"):
            return f"schedule {name!r} has not planned its next tick"
    return None

"""Where a worker's shards come from: the *assignment source* seam.

A worker reads exactly the shards its assignment source grants, each with the grant
token its owner fence holds, and only while the source keeps its lease valid. The
coordinator-backed source (``streamworks.runtime.membership``) drives this with
heartbeats; :class:`StaticAssignment` grants a fixed set for tests and
hand-provisioned deployments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

import anyio
from anyio.abc import TaskStatus

from streamworks.protocol.shards import ShardId

if TYPE_CHECKING:
    from streamworks.runtime.worker import Worker

__all__ = ("AssignmentSource", "StaticAssignment")


class AssignmentSource(Protocol):
    """Drives one worker's assignment."""

    async def run(self, worker: Worker, *, task_status: TaskStatus[None]) -> None:
        """Join, keep the assignment current, and report ``started`` once joined.

        Runs until cancelled. Uses ``worker.apply_assignment``, ``worker.start_drain``,
        ``worker.drop_shards`` and ``worker.lease``.
        """
        ...

    async def leave(self, worker: Worker) -> None:
        """Leave the group after a graceful shutdown so the shards move at once."""
        ...


class StaticAssignment:
    """A fixed assignment: ``{shard: grant token}`` with a lease that never expires.

    The owner fences must already hold the tokens (``streamworks.coordinator.provision``
    writes them); the runtime never writes fences itself.
    """

    def __init__(self, grants: Mapping[ShardId, str]) -> None:
        self.grants = dict(grants)

    async def run(
        self, worker: Worker, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        worker.lease.renew(math.inf)
        worker.apply_assignment(self.grants)
        task_status.started()
        await anyio.sleep_forever()

    async def leave(self, worker: Worker) -> None:
        return None

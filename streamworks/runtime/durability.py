"""Writes that follow a stream's durable publishing (``min_replicas``) on the worker side.

A dead letter is written to its own key (its own hash tag, maybe on another node than
the shard) and then the original entry is acknowledged. Without a replica's
acknowledgement, a failover of the dead-letter node right after the write could lose
the dead letter while the ack survives on the shard's node: the message would be gone.
So for a stream declared with ``min_replicas``, the ``XADD`` of its dead letters ends
with ``WAIT`` in the same write, like a durable publish (docs/cluster.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from streamworks.redis.wire import Arg, run_batch_wait

if TYPE_CHECKING:
    from streamworks.runtime.worker import Worker

__all__ = ("add_dead_letter",)

log = logging.getLogger("streamworks.durability")


async def add_dead_letter(
    worker: Worker, key: str, fields: Mapping[str | bytes, Any], stream: str
) -> None:
    """``XADD key * fields``; with the stream's ``min_replicas``, wait for them.

    When fewer replicas acknowledge in time (none is connected, e.g. right after a
    failover), the dead letter stays written on the primary and a warning is logged:
    a dead letter is not retried (each retry would add another copy).

    Raises:
        RedisError: the write failed (the caller keeps the message pending).
    """
    spec = worker.app.streams.get(stream)
    if spec is None or not spec.min_replicas:
        await worker.redis.xadd(key, fields)
        return
    command: list[Arg] = ["XADD", key, "*"]
    for name, value in fields.items():
        command += [name, value if isinstance(value, bytes | str | int) else str(value)]
    timeout_ms = max(1, int(spec.replica_timeout * 1000))
    [reply], [waited] = await run_batch_wait(worker.redis, [command], spec.min_replicas, timeout_ms)
    if isinstance(reply, Exception):
        raise reply
    if not (type(waited) is int and waited >= spec.min_replicas):
        log.warning(
            "dead letter %s in %s acknowledged by %s replica(s), not %d",
            reply.decode() if isinstance(reply, bytes) else reply,
            key,
            waited,
            spec.min_replicas,
        )

"""A stream declared by an app (``app.stream``): what the runtime needs to know of it.

It lives in the runtime, below the app (``app → middleware → runtime``): connections,
workers and producers read the declarations; ``streamworks.app`` re-exports it as
:class:`streamworks.StreamSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ("StartPosition", "StreamSpec")

#: Where a new consumer group starts on a stream that already has entries.
StartPosition = Literal["earliest", "latest"]


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """A stream declared by the app.

    Attributes:
        name: the stream name.
        shards: shard count used when the stream is created (never to rescale it).
        retention: seconds entries are kept at least; after that they are trimmed
            once every group has acknowledged them. None keeps everything.
        delete_on_ack: trim entries as soon as every group has acknowledged them.
        dedup_window: seconds an event id is remembered per shard by idempotent
            publish; None disables shard-level publish dedup.
        start: where this group starts if the stream already exists.
        min_replicas: durable publishing: a publish returns only once this many
            replicas of the shard's primary have the entry (``WAIT``), else it raises
            :class:`~streamworks.exceptions.PublishNotDurableError`; 0 returns once the
            primary has it (see docs/cluster.md for what a failover can lose then).
        replica_timeout: seconds a publish waits for those replicas.
    """

    name: str
    shards: int
    retention: float | None = None
    delete_on_ack: bool = False
    dedup_window: float | None = None
    start: StartPosition = "earliest"
    min_replicas: int = 0
    replica_timeout: float = 1.0

"""A group's Redis consumer groups on the streams it subscribes to (PROTOCOL §4).

Before any shard of a stream is granted to a group, the group's consumer group
exists on every assignable shard of it, and the group is recorded in the stream's
subscription registry — the evidence that tells a new group from one whose metadata
was lost (E21).

Where a group starts on a stream it subscribes to *for the first time* is the
member's choice (``StreamSpec.start``, sent as ``subscriptionStarts``): ``earliest``
(the first entry still retained) or ``latest`` (only entries published after it
joined). Later additions to an already subscribed stream — the shards a scale-out
creates, consumer groups re-created on a new layout — start at the beginning of
their shard, which they always have seen in full.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from streamworks.coordinator import provision
from streamworks.coordinator.core.streams import StreamMeta
from streamworks.coordinator.store import Store
from streamworks.protocol.control import StartPosition
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace

__all__ = ("Subscriptions",)

log = logging.getLogger("streamworks.coordinator")


class Subscriptions:
    """Provisions consumer groups for subscriptions; remembers what it checked."""

    def __init__(self, store: Store, keyspace: Keyspace) -> None:
        self.store = store
        self.keyspace = keyspace
        # (stream, group, layout version) whose consumer groups are known to exist.
        self._seen: set[tuple[str, str, int]] = set()

    async def ensure(
        self,
        group_id: str,
        metas: Mapping[str, StreamMeta],
        starts: Mapping[str, StartPosition] | None = None,
    ) -> None:
        """Make sure ``group_id`` has its consumer group on every assignable shard of
        each stream in ``metas``; a stream it subscribes to for the first time starts
        at ``starts[stream]`` (default ``earliest``)."""
        for name, meta in metas.items():
            # Per layout version: a scale-out racing a group's first subscription may
            # have created shards without this group's consumer group; creating it is
            # idempotent, so each replica checks once per layout.
            seen = (name, group_id, meta.layout_version)
            if seen in self._seen:
                continue
            shards = [ShardId.parse(s) for s in meta.shard_ids(meta.assignable())]
            if group_id in await self.store.subscribed_groups(name):
                await provision.create_group(
                    self.store.scripts, self.keyspace, shards, group_id, "earliest"
                )
                self._seen.add(seen)
                continue
            start: StartPosition = (starts or {}).get(name, "earliest")
            missing = await provision.create_group(
                self.store.scripts, self.keyspace, shards, group_id, start
            )
            if missing:
                log.error("stream %s: shard keys missing for %s", name, [str(s) for s in missing])
            await self.store.record_subscription(name, group_id)
            self._seen.add(seen)
            log.info(
                "group %s subscribed to %s: consumer groups created (start %s)",
                group_id,
                name,
                start,
            )

    def forget(self, stream: str, group_id: str) -> None:
        """Forget what was checked for ``group_id`` on ``stream`` (it unsubscribed)."""
        self._seen = {s for s in self._seen if s[:2] != (stream, group_id)}

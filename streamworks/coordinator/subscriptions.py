"""A group's Redis consumer groups on the streams it subscribes to (docs/protocol.md#subscriptions).

Before any shard of a stream is granted to a group, the group is recorded in the
stream's subscription registry — the evidence that tells a new group from one whose
metadata was lost (E21), and the list every stream creation and scale-out creates
consumer groups for — and its consumer group exists on every assignable shard of it.
A group that joins naming a stream that does not exist yet is recorded too, so the
stream is created with its consumer groups (a deploy that adds a handler before
``streamworks streams create`` loses nothing).

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
        # (stream, group, stream revision) whose consumer groups are known to exist.
        # Keyed by the revision, which every replica reads from Redis: an unsubscribe
        # (on any replica) commits the stream's metadata, so no replica trusts what it
        # checked before it (a resubscribe through another replica re-creates them).
        self._seen: set[tuple[str, str, int]] = set()

    async def ensure(
        self,
        group_id: str,
        streams: Mapping[str, tuple[int, StreamMeta | None]],
        starts: Mapping[str, StartPosition] | None = None,
    ) -> None:
        """Make sure ``group_id`` has its consumer group on every assignable shard of
        each stream in ``streams`` (name -> revision and metadata, as loaded); a stream
        it subscribes to for the first time starts at ``starts[stream]`` (default
        ``earliest``). A stream that does not exist yet (metadata None) gets the
        subscription recorded: creating the stream creates the group's consumer groups
        with its shards."""
        for name, (rev, meta) in streams.items():
            if meta is None:
                await self._record_intent(name, group_id)
                continue
            # Per revision: a scale-out racing a group's first subscription may have
            # created shards without this group's consumer group; creating it is
            # idempotent, so each replica checks once per revision.
            seen = (name, group_id, rev)
            if seen in self._seen:
                continue
            start: StartPosition = "earliest"
            if group_id not in await self.store.subscribed_groups(name):
                # First subscription: register first, then provision the layout loaded
                # after the registration. A scale-out that reads the registry before
                # it has committed a layout this load sees; one that reads it after
                # creates its shards with this group (no shard is left without it).
                await self.store.record_subscription(name, group_id)
                start = (starts or {}).get(name, "earliest")
                _, reloaded = await self.store.load_stream(name)
                meta = reloaded or meta
                log.info("group %s subscribed to %s (start %s)", group_id, name, start)
            shards = [ShardId.parse(s) for s in meta.shard_ids(meta.assignable())]
            missing = await provision.create_group(
                self.store.scripts, self.keyspace, shards, group_id, start
            )
            if missing:
                log.error("stream %s: shard keys missing for %s", name, [str(s) for s in missing])
            self._seen.add(seen)

    async def _record_intent(self, stream: str, group_id: str) -> None:
        """Record that ``group_id`` subscribes to ``stream``, which does not exist yet."""
        if group_id in await self.store.subscribed_groups(stream):
            return
        await self.store.record_subscription(stream, group_id)
        log.info(
            "group %s subscribes to %s, which does not exist yet: its consumer groups are "
            "created with the stream",
            group_id,
            stream,
        )

    def forget(self, stream: str, group_id: str) -> None:
        """Forget what was checked for ``group_id`` on ``stream`` (it unsubscribed)."""
        self._seen = {s for s in self._seen if s[:2] != (stream, group_id)}

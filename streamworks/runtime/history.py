"""The member's protocol steps, for a history recorder (``protocol/history.py``).

One call at each hook point of the runtime; each returns after one ``is None``
check when nothing records (the default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from streamworks.protocol import history
from streamworks.protocol.control import HeartbeatResponse
from streamworks.protocol.shards import ShardId

if TYPE_CHECKING:
    from streamworks.runtime.message import Message
    from streamworks.runtime.reader import ShardReader
    from streamworks.runtime.worker import Worker

__all__ = ("acked", "answered", "delivered", "released", "released_shard")


def answered(worker: Worker, response: HeartbeatResponse, grants: Mapping[ShardId, str]) -> None:
    """``worker`` applied ``response``: it may read ``grants`` now, drains the revoked
    shards, and its lease (when the answer renewed it) lasts until ``expires_at``."""
    sink = history.sink
    if sink is None:
        return
    status = str(response.status)
    sink.heartbeat(
        group=worker.group,
        member=worker.member_id,
        status=status,
        member_epoch=response.member_epoch,
        group_epoch=response.group_epoch,
        assigned={str(s): history.token_of(g) for s, g in grants.items()},
        revoke=response.revoke,
        lease_until=worker.lease.deadlines.expires_at if status == "OK" else None,
    )


def released(worker: Worker, reader: ShardReader) -> None:
    """The last run of ``reader``'s shard ended: the member no longer holds it."""
    if not reader.deletes_acked:
        released_shard(worker, reader.shard_name, reader.token, reader.stop_reason)


def released_shard(worker: Worker, shard: str, token: str, reason: str | None) -> None:
    """The last run on ``shard`` (a read shard, or the schedule shard) ended: the
    member no longer holds it."""
    sink = history.sink
    if sink is not None:
        sink.release(
            group=worker.group,
            member=worker.member_id,
            shard=shard,
            token=history.token_of(token),
            reason=reason or "stopped",
        )


def delivered(reader: ShardReader, entries: int) -> None:
    """A read or claim by ``reader`` took ``entries`` entries, handed on under a valid lease."""
    sink = history.sink
    if sink is not None and not reader.deletes_acked:
        sink.read(
            group=reader.group,
            member=reader.consumer,
            shard=reader.shard_name,
            token=history.token_of(reader.token),
            entries=entries,
        )


def acked(batch: Mapping[ShardReader, Sequence[Message]], at: float | None) -> None:
    """The entries of ``batch`` were acknowledged by one flush sent at ``at``."""
    sink = history.sink
    if sink is None:
        return
    for reader, messages in batch.items():
        if reader.deletes_acked:
            continue
        token = history.token_of(reader.token)
        for m in messages:
            sink.ack(
                group=reader.group,
                member=reader.consumer,
                shard=reader.shard_name,
                token=token,
                entry=m._rid.decode(),
                at=at,
            )

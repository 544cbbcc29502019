"""A scale-out whose last layout commit is lost (issue 18, finding 5).

A scale-out used to create the new shards' keys, then commit the layout. A failover
that lost that commit left keys no layout knows; a producer that had been routed to
them kept publishing there (acknowledged, even with ``min_replicas``) and nothing ever
read them. Now the layout is committed first with the new shards PROVISIONING (not
routable, not assigned; on the replicas before any key exists), then the keys are
created, then the shards committed ACTIVE. Losing the *last* commit of a scale-out
therefore leaves a layout that knows the shards, and the coordinator finishes the
scale-out; every acknowledged publish is read.

The loss is made with ``DUMP``/``RESTORE`` of the stream's metadata, as the state
before the scale-out's last commit (what a failover to a replica that missed it
holds); the failovers themselves are in ``tests/cluster/test_control_plane_failover.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamworks.clock import Clock
from streamworks.redis.scripts import Scripts
from streamworks.runtime.connection import create_producer
from streamworks.runtime.leased_routing import LeasedRouting
from streamworks.runtime.producer import Record
from streamworks.testing import TestRuntime
from tests.resharding.helpers import keys_on, probe_app
from tests.support import wait_for


async def test_an_acknowledged_publish_on_a_new_shard_survives_the_loss_of_the_last_commit(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app, probe = probe_app("g", {"orders": 1})
    async with streamworks_runtime(app, workers=1) as rt:
        service = rt.service
        assert service is not None
        meta_key = rt.keyspace.stream_meta("orders")
        snapshots: list[bytes] = []
        real_commit = service.store.commit_stream

        async def snapshotting(*args: Any, **kwargs: Any) -> Any:
            snapshots.append(await rt.redis.dump(meta_key))  # the state each commit replaces
            return await real_commit(*args, **kwargs)

        service.store.commit_stream = snapshotting  # type: ignore[method-assign]
        await service.scale_stream("orders", 2)
        service.store.commit_stream = real_commit  # type: ignore[method-assign]

        # A producer routed over the new layout (its clock stalls: the table stays
        # valid to it) publishes to the new shard: acknowledged.
        stalled = Clock()
        routing = LeasedRouting(rt.coordinator, clock=stalled)
        assert (await routing.routing("orders")).shard_count == 2
        producer = create_producer(app, rt.settings, rt.redis, Scripts(rt.redis), routing)
        stalled.offset = -3600.0
        [key] = keys_on(1, 2)
        published = await producer.publish("orders", Record({"id": "on-the-new-shard"}, key=key))
        assert published.shard == "orders/1@1"

        # A failover loses the scale-out's last commit.
        await rt.redis.restore(meta_key, 0, snapshots[-1], replace=True)
        _, meta = await service.store.load_stream("orders")
        assert meta is not None
        # The layout Redis kept knows the new shard: the coordinator finishes the
        # scale-out, a member is assigned the shard and reads the message.
        assert "orders/1@1" in meta.shard_ids()

        async def read() -> bool:
            return "on-the-new-shard" in probe.ids()

        await wait_for(read, timeout=20, message="the message published to the new shard")
        info = await service.stream_info("orders")
        assert info.shard_count == 2 and all(s.state == "ACTIVE" for s in info.shards)

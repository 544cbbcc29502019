"""Scale-in 10 -> 1 while worker processes consume and producers publish (E9, E11, E13).

A coordinator and two workers of the instrumented app run as real processes; two
producers in the test process publish continuously through the coordinator's leased
routing. Before the scale request each removed shard receives one *blocker*: a message
whose handler fails until the test heals it, so every removed shard still holds a
pending entry when the routing fence passes. A :class:`DrainWatch` observes the removed
shards atomically (XINFO GROUPS, pending ids, undelivered ids) on the sequence the
instrumented handler numbers its records with, so the moment a key vanished is
ordered against the end of every handling.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from streamworks import Record
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from tests.e2e.apps import instrumented
from tests.e2e.harness import (
    GROUP,
    STREAM,
    Cluster,
    Publisher,
    duplicates,
    producer_app,
    wait_handled,
    wait_ready,
    wait_stable,
    wait_until,
)
from tests.resharding.helpers import (
    DrainWatch,
    blocked,
    draining,
    fence_of,
    keys_on,
    phase,
    retired,
)

SHARDS = 10
WORKER_ENV: dict[str, Any] = {"E2E_SHARDS": str(SHARDS), "E2E_MAX_ATTEMPTS": "1000000"}


#: Why this test runs on a single node only (``--redis-target=cluster`` skips it).
_ATOMIC_OBSERVER = (
    "its instruments read shard state and handler records in one atomic script, which "
    "a cluster cannot run across slots"
)


@pytest.mark.no_cluster(_ATOMIC_OBSERVER)
@pytest.mark.seed("E9")
@pytest.mark.seed("E11")
@pytest.mark.seed("E13")
async def test_ten_to_one_with_live_workers_while_producers_publish(
    cluster: Cluster, redis: Any
) -> None:
    """10 -> 1 under load: the removed shards stay DRAINING while their blocker is
    pending (the coordinator checked them after the fence and refused), and are retired
    only once drained: every entry ever written to a removed shard was handled before
    its key vanished, the last observation before that showed pending 0 / lag 0 (or
    only entries handled in between), lag was never nil, the keys and their fences are
    gone afterwards and never come back, and every published message was handled."""
    keyspace = Keyspace(cluster.prefix)
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    removed = {f"{STREAM}/{i}@0": keyspace.stream(ShardId(STREAM, i, 0)) for i in range(1, SHARDS)}
    blockers = {
        shard: Record({"id": f"blocker-{i}", "fail_until_healed": True}, key=key)
        for i, shard in enumerate(removed, start=1)
        for key in keys_on(i, SHARDS, stem="blocker")
    }
    watch = DrainWatch(redis, instrumented.seq_key(cluster.prefix), removed)
    apps = [producer_app(cluster), producer_app(cluster)]
    async with cluster.client() as client:
        await client.create_stream(STREAM, SHARDS)
        for i in range(2):
            cluster.start_worker(f"worker-{i}", **WORKER_ENV)
        await wait_stable(client, 2)
        async with apps[0].connect(), apps[1].connect():
            publishers = [Publisher(app, f"p{i}") for i, app in enumerate(apps)]
            async with anyio.create_task_group() as tg:
                for publisher in publishers:
                    tg.start_soon(publisher.run)
                await publishers[0].wait_count(200)
                placed = await apps[0].publish_many(STREAM, list(blockers.values()))
                assert [p.shard for p in placed] == list(blockers)
                tg.start_soon(watch.run)
                await wait_until(_true(lambda: watch.rounds > 0), 5, "a first observation")

                info = await client.scale_stream(STREAM, 1)
                assert info.shard_count == 1 and draining(info) == sorted(removed)
                fence_ms = fence_of(info)

                # After the fence every removed shard was checked and refused: pending.
                async def refused_after_fence() -> Any:
                    info = await client.stream(STREAM)
                    reasons = blocked(info)
                    if phase(info) != "DRAINING":
                        return None
                    if not all("pending" in reasons.get(s, "") for s in removed):
                        return None
                    return info

                info = await wait_until(refused_after_fence, 20, "every removed shard refused")
                assert draining(info) == sorted(removed)
                assert await redis.exists(*removed.values()) == len(removed)
                assert not any(watch.gone_seq(s) for s in removed)

                for record in blockers.values():
                    await redis.set(instrumented.healed_key(cluster.prefix, record.value["id"]), 1)

                async def complete() -> Any:
                    info = await client.stream(STREAM)
                    return info if not draining(info) and phase(info) == "NONE" else None

                info = await wait_until(complete, 30, "the migration to complete")
                assert [s.shard for s in info.shards] == [f"{STREAM}/0@0"]
                assert info.migration is not None
                assert retired(info) == sorted(removed)
                # Traffic goes on on the one shard left.
                for publisher in publishers:
                    await publisher.wait_count(len(publisher.published) + 100)
                published = [i for p in publishers for i in await p.stop()]
                watch.stop()

        ids = published + [r.value["id"] for r in blockers.values()]
        records = await wait_handled(redis, cluster.prefix, ids, timeout=30)

    # Where every message went, and when each entry's handling first ended.
    on_shard: dict[str, list[str]] = {s: [] for s in removed}
    for publisher in publishers:
        for result in publisher.results:
            if result.shard in on_shard:
                on_shard[result.shard].append(result.entry_id)
    for shard, result in zip(blockers, placed, strict=True):
        on_shard[shard].append(result.entry_id)
    first_end: dict[tuple[str, str], int] = {}
    for rec in records:
        if rec.end is not None:
            at = (rec.shard, rec.entry)
            first_end[at] = min(rec.end, first_end.get(at, rec.end))

    for shard, key in removed.items():
        gone = watch.gone_seq(shard)
        assert gone is not None, f"{shard} never observed gone"
        assert not watch.recreated(shard), f"{shard} was re-created after its retirement"
        late = [e for e in on_shard[shard] if first_end.get((shard, e), gone + 1) > gone]
        assert not late, f"{shard} vanished (#{gone}) before these entries were handled: {late}"
        last = watch.last_present(shard)
        assert last is not None
        if not last.drained:
            # Drained between the two rounds: whatever it still listed ended before.
            waiting = {e for g in last.groups for e in g.waiting}
            assert all(first_end.get((shard, e), gone + 1) < gone for e in waiting), (
                f"{shard} retired while {last} showed {sorted(waiting)} not done"
            )
        assert [g.group for g in last.groups] == [GROUP], last
        assert await redis.exists(key, keyspace.fence(ShardId.parse(shard), GROUP)) == 0
    nil = [
        (s, str(o)) for s, o in watch.states() if o.exists and any(g.lag is None for g in o.groups)
    ]
    assert not nil, f"lag was nil (the runtime must never cause it, E12): {nil[:3]}"
    pending_seen = {s for s, o in watch.states() if o.exists and any(g.pending for g in o.groups)}
    assert pending_seen == set(removed)  # the blockers really were pending meanwhile

    dups = duplicates(records)
    print(
        f"published {len(ids)} (on removed shards: "
        f"{sum(len(v) for v in on_shard.values())}), handled {len({p.id for p in records})}, "
        f"processings {len(records)}, ids processed more than once {len(dups)}, "
        f"watch rounds {watch.rounds}, fence at {fence_ms}"
    )


def _true(condition: Any) -> Any:
    async def probe() -> bool:
        return bool(condition())

    return probe

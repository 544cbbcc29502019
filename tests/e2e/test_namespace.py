"""Namespace identity on real processes: a worker or producer on another Redis
database or key prefix than its coordinator refuses in one line, instead of joining
and reading nothing."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import pytest

from streamworks import App
from streamworks.exceptions import NamespaceMismatchError
from tests.e2e.harness import (
    GROUP,
    STREAM,
    Cluster,
    create_stream,
    instrumented,
    member_of,
    producer_app,
    wait_ready,
    wait_stable,
)


def other_database(url: str) -> str:
    """``url`` with another database number (same server)."""
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(db + 1) % 16}"))


def wrong(cluster: Cluster, kind: str) -> dict[str, str]:
    if kind == "database":
        return {"STREAMWORKS_REDIS_URL": other_database(cluster.redis_url)}
    return {"STREAMWORKS_KEY_PREFIX": f"{cluster.prefix}-other"}


#: Under --redis-acl, a process on another key prefix is refused its namespace id (its
#: user's ACL is for the coordinator's prefix): the refusal is the misconfiguration.
KINDS = ["database", pytest.param("prefix", marks=pytest.mark.acl_refused("another prefix"))]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_worker_outside_the_coordinators_namespace_exits_with_one_line(
    cluster: Cluster, kind: str
) -> None:
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    worker = cluster.start_worker("stray", **wrong(cluster, kind))
    code = await worker.wait_exit(20)
    output = worker.output()
    assert code != 0, output
    assert "Traceback" not in output, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: namespace mismatch: coordinator "), output
    assert "no namespace id" in last and coordinator.url in last, last
    # It left the group on its way out; the same worker in the coordinator's
    # namespace joins and gets every shard.
    async with cluster.client() as client:
        group = await client.group(GROUP)
        assert member_of(group, worker) is None, group  # no lease left to run out
        cluster.start_worker("right")
        await wait_stable(client, 1)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_producer_outside_the_coordinators_namespace_raises(
    cluster: Cluster, kind: str
) -> None:
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    right = producer_app(cluster)
    async with right.connect():
        published = await right.publish(STREAM, {"id": "fine"}, key="k")
    assert published.entry_id
    changes = (
        {"redis_url": other_database(cluster.redis_url)}
        if kind == "database"
        else {"key_prefix": f"{cluster.prefix}-other"}
    )
    stray = App("e2e-stray", settings=cluster.settings(**changes))
    stray.stream(STREAM, shards=instrumented.SHARDS)
    async with stray.connect():
        with pytest.raises(NamespaceMismatchError, match="namespace mismatch") as caught:
            await stray.publish(STREAM, {"id": "lost"}, key="k")
    assert "\n" not in str(caught.value)
    assert coordinator.url in str(caught.value)

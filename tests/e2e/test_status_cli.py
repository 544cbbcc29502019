"""``status`` and ``streams scale --wait`` as an operator reads them (issue 12): a clear
line when there is nothing, members that left are not listed as EXPIRED, a finished
scale-in leaves no raw dict in the title, and the piped scale output is line by line
with a fence countdown and a last line of its own."""

from __future__ import annotations

import signal
from typing import Any

from tests.e2e.harness import GROUP, STREAM, Cluster, create_stream, wait_ready, wait_stable
from tests.e2e.test_cli import text


async def test_status_and_scale_read_well(cluster: Cluster, redis: Any) -> None:
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    empty = await cluster.cli("status")
    assert empty.returncode == 0, text(empty)
    assert f"no streams and no groups yet at {coordinator.url}" in text(empty)[0]
    no_streams = await cluster.cli("streams", "ls")
    assert no_streams.returncode == 0 and "no streams yet" in text(no_streams)[0]

    await create_stream(cluster)
    staying = cluster.start_worker("staying")
    leaving = cluster.start_worker("leaving")
    async with cluster.client() as client:
        await wait_stable(client, 2)
        leaving.send(signal.SIGTERM)  # a graceful leave
        assert await leaving.wait_exit(20) == 0
        await wait_stable(client, 1)
    shown = text(await cluster.cli("status"))[0]
    # A member that left gracefully is gone from the group at once: not listed, not
    # EXPIRED, not even with --all (only expired or fenced members are kept a while).
    assert "EXPIRED" not in shown, shown
    assert "left or expired recently" not in shown, shown
    everything = text(await cluster.cli("status", "--all"))[0]
    assert "EXPIRED" not in everything, everything
    assert everything.count("STABLE") >= 1, everything

    scaled = await cluster.cli("streams", "scale", STREAM, "--shards", "4", "--wait")
    out = text(scaled)[0]
    assert scaled.returncode == 0, text(scaled)
    lines = out.splitlines()
    assert any("FENCING: routing fence in ~" in line for line in lines), out
    assert lines[-1] == f"migration of {STREAM} complete (4 shards)", out
    after = text(await cluster.cli("status"))[0]
    assert "{" not in after, after  # no raw migration dict in the title
    assert "last migration complete (2 shards retired)" in after, after
    assert f"group {GROUP}" in after and staying.alive()

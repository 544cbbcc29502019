"""Quick in-process checks: ``TestRuntime.scale`` round trip and ``streams scale --wait``
against a live coordinator."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import anyio
import pytest

from streamworks.protocol.shards import ShardId
from streamworks.testing import TestRuntime
from tests.e2e.harness import REPO
from tests.resharding.helpers import draining, keys_on, probe_app


@pytest.mark.seed("E13")
async def test_testruntime_scale_out_then_in_round_trip(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """2 -> 4 -> 2 with two workers: ``scale`` returns once the layout is assigned
    (scale-out) or the removed shards are retired (scale-in); the added shards have a
    new incarnation and are gone again afterwards; every message is handled."""
    app, probe = probe_app("g", {"r": 2}, concurrency=8)
    ids: list[str] = []

    async def publish(tag: str, count: int) -> None:
        for n in range(40):
            ids.append(f"{tag}-{n}")
            await app.publish("r", {"id": ids[-1]}, key=keys_on(n % count, count)[0])

    async with streamworks_runtime(app, workers=2) as rt:
        await publish("two", 2)
        await rt.scale("r", 4)
        added = [rt.keyspace.stream(ShardId("r", i, 1)) for i in (2, 3)]
        assert await rt.shard_keys("r") == [
            rt.keyspace.stream(ShardId("r", 0, 0)),
            rt.keyspace.stream(ShardId("r", 1, 0)),
            *added,
        ]
        await publish("four", 4)
        assert [await rt.redis.xlen(k) for k in added] == [10, 10]
        await rt.scale("r", 2)
        assert rt.service is not None
        info = await rt.service.stream_info("r")
        assert [s.shard for s in info.shards] == ["r/0@0", "r/1@0"] and not draining(info)
        assert await rt.redis.exists(*added) == 0
        await publish("two-again", 2)
        await rt.wait_idle()
    assert probe.ids() == set(ids)


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMWORKS_")}
    return {**env, "PYTHONPATH": str(REPO), "COLUMNS": "200"}


async def cli(*args: str) -> tuple[int, str, str]:
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [sys.executable, "-m", "streamworks", *args], env=cli_env(), cwd=REPO, check=False
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.seed("E9")
async def test_streams_scale_wait_cli_against_a_live_coordinator(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """``streamworks streams scale c --shards 1 --wait`` against a coordinator serving
    HTTP, with a worker draining the removed shard: exit 0 once the shard is retired,
    printing completion; the scale-out back to 3 completes at once. A wait that cannot
    finish (no worker, entries left) gives up after ``--timeout`` with one error line."""
    app, probe = probe_app("g", {"c": 2})
    async with streamworks_runtime(app, workers=1, http=True) as rt:
        url = str(rt.http_url)
        for n in range(20):
            await app.publish("c", {"id": f"m{n}"}, key=keys_on(1, 2)[0])
        code, out, err = await cli(
            "streams", "scale", "c", "--shards", "1", "--wait", "--coordinator", url
        )
        assert code == 0, out + err
        assert "routing now has 1 shard " in out
        assert "migration of c complete (1 shard)" in out
        assert len(probe.ids()) == 20
        assert not await rt.redis.exists(rt.keyspace.stream(ShardId("c", 1, 0)))

        code, out, err = await cli(
            "streams", "scale", "c", "--shards", "3", "--wait", "--coordinator", url
        )
        assert code == 0, out + err
        assert "migration of c complete (3 shards)" in out

        await rt.stop_worker(0)
        await app.publish("c", {"id": "stuck"}, key=keys_on(2, 3)[0])
        code, out, err = await cli(
            "streams",
            "scale",
            "c",
            "--shards",
            "2",
            "--wait",
            "--timeout",
            "1",
            "--coordinator",
            url,
        )
        assert code != 0
        assert "still draining" in err and "Traceback" not in err, err

"""A coordinator keeps an idle HTTP connection for ``coordinator.http_keep_alive``
(75 s), longer than the clients' own idle expiry (60 s): members heartbeating at
intervals above uvicorn's default 5 s reuse their connection instead of reconnecting
each time, and no request meets a connection the server is just closing (with both
sides at 5 s, a heartbeat every 5 s raced the server's close and failed)."""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import ByteStream

from streamworks.protocol.client import CLIENT_KEEPALIVE
from streamworks.settings import CoordinatorSettings
from tests.e2e.harness import Cluster, wait_ready

pytestmark = pytest.mark.timeout(60)

#: uvicorn's default keep-alive (s): the idle time that closed a connection before.
UVICORN_DEFAULT = 5


async def _livez(stream: ByteStream) -> bytes:
    await stream.send(b"GET /livez HTTP/1.1\r\nhost: coordinator\r\n\r\n")
    reply = b""
    with anyio.fail_after(5):
        while b"\r\n\r\n" not in reply:
            reply += await stream.receive()
    return reply


async def test_an_idle_connection_outlives_a_long_heartbeat_interval(cluster: Cluster) -> None:
    assert CoordinatorSettings().http_keep_alive > CLIENT_KEEPALIVE
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    host, port = coordinator.url.removeprefix("http://").rsplit(":", 1)
    async with await anyio.connect_tcp(host, int(port)) as stream:
        assert (await _livez(stream)).startswith(b"HTTP/1.1 200")
        # Idle longer than uvicorn's default: the subject of the test, not a wait for
        # something to happen.
        await anyio.sleep(UVICORN_DEFAULT + 2)
        closed = False
        with anyio.move_on_after(0.2):
            try:
                await stream.receive()
            except anyio.EndOfStream:
                closed = True
        assert not closed, "the coordinator closed an idle connection after 7 s"
        assert (await _livez(stream)).startswith(b"HTTP/1.1 200")  # the same connection

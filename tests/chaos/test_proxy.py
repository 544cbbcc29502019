"""The chaos harness's TCP proxy: it forwards, cuts (reset + refuse for a while) and
delays, on 127.0.0.1, against a small echo server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.chaos.proxy import ProxyHub
from tests.e2e.harness import wait_until


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


@pytest.fixture
def hub() -> Iterator[ProxyHub]:
    hub = ProxyHub()
    try:
        yield hub
    finally:
        hub.close()


async def roundtrip(port: int, payload: bytes = b"ping") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), 5)
    finally:
        writer.close()


async def test_forwards_both_ways(hub: ProxyHub, echo_port: int) -> None:
    proxy = await hub.add("p", echo_port)
    payload = bytes(range(256)) * 1000
    assert await roundtrip(proxy.port, payload) == payload


async def test_cut_resets_live_connections_and_refuses_new_ones_for_a_while(
    hub: ProxyHub, echo_port: int
) -> None:
    proxy = await hub.add("p", echo_port)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"x")
    assert await reader.readexactly(1) == b"x"
    assert await hub.cut("p", 0.5) == 1
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(reader.readexactly(1), 5)
    writer.close()
    cut_at = time.monotonic()
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await roundtrip(proxy.port)

    async def back() -> bool:
        try:
            return await roundtrip(proxy.port) == b"ping"
        except (ConnectionError, asyncio.IncompleteReadError):
            return False

    await wait_until(back, 5, "the proxy to accept connections again")
    assert time.monotonic() - cut_at >= 0.3  # refused for (about) the cut's length


async def test_delay_adds_latency_in_both_directions(hub: ProxyHub, echo_port: int) -> None:
    proxy = await hub.add("p", echo_port)
    await roundtrip(proxy.port)
    await hub.delay("p", 150)
    started = time.monotonic()
    assert await roundtrip(proxy.port) == b"ping"
    assert time.monotonic() - started >= 0.3
    await hub.delay("p", 0)
    started = time.monotonic()
    assert await roundtrip(proxy.port) == b"ping"
    assert time.monotonic() - started < 0.3

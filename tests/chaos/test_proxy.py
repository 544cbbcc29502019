"""The chaos harness's proxies. The TCP proxy forwards, cuts (reset + refuse for a
while), delays and retargets, on 127.0.0.1, against a small echo server; the HTTP
proxy holds, duplicates and reorders requests, against a small HTTP server, through
a real HTTP client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import httpx
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


async def test_retarget_resets_live_connections_and_forwards_to_the_new_upstream(
    hub: ProxyHub, echo_port: int
) -> None:
    """A failover: the proxy in front of "Redis" is repointed at the promoted server."""
    seen: list[bytes] = []

    async def other(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read(100)
        seen.append(data)
        writer.write(b"new:" + data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(other, "127.0.0.1", 0)
    try:
        proxy = await hub.add("p", echo_port)
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"x")
        assert await reader.readexactly(1) == b"x"
        assert await hub.retarget(["p"], int(server.sockets[0].getsockname()[1])) == 1
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1), 5)
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(8), 5) == b"new:ping"
        writer.close()
        assert seen == [b"ping"]
    finally:
        server.close()


# -- the HTTP proxy (tests/chaos/http_proxy.py) --------------------------------------------
class Upstream:
    """A tiny HTTP server: records each request's body on arrival, answers it back."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        body = await reader.readexactly(length)
        self.bodies.append(body)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    async def __aenter__(self) -> Upstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


async def post(port: int, body: bytes, timeout: float = 5.0) -> bytes:
    async with httpx.AsyncClient(timeout=timeout) as client:
        answer = await client.post(f"http://127.0.0.1:{port}/heartbeat", content=body)
        return answer.content


async def test_http_proxy_forwards_each_request_and_its_answer(hub: ProxyHub) -> None:
    async with Upstream() as upstream:
        proxy = await hub.add_http("h", upstream.port)
        assert [await post(proxy.port, f"b{i}".encode()) for i in range(3)] == [b"b0", b"b1", b"b2"]
        assert upstream.bodies == [b"b0", b"b1", b"b2"]
        assert proxy.stats.requests == 3 and proxy.in_flight == 0


async def test_http_hold_delivers_a_request_after_its_sender_gave_up(hub: ProxyHub) -> None:
    async with Upstream() as upstream:
        proxy = await hub.add_http("h", upstream.port)
        await hub.http_fault("h", "hold", 0.6, 5)
        sent = time.monotonic()
        with pytest.raises(httpx.TimeoutException):
            await post(proxy.port, b"stale", timeout=0.2)
        assert upstream.bodies == []  # not yet: held

        async def delivered() -> bool:
            return upstream.bodies == [b"stale"]

        await wait_until(delivered, 5, "the held request delivered")
        assert time.monotonic() - sent >= 0.5
        assert proxy.stats.held == 1 and proxy.stats.client_left == 1


async def test_http_duplicate_delivers_every_request_twice(hub: ProxyHub) -> None:
    async with Upstream() as upstream:
        proxy = await hub.add_http("h", upstream.port)
        await hub.http_fault("h", "duplicate", 0.2, 5)
        assert await post(proxy.port, b"once") == b"once"  # one answer for the client

        async def twice() -> bool:
            return upstream.bodies == [b"once", b"once"]

        await wait_until(twice, 5, "the request delivered a second time")
        assert proxy.stats.duplicated == 1


async def test_http_reorder_lets_later_requests_overtake_earlier_ones(hub: ProxyHub) -> None:
    async with Upstream() as upstream:
        proxy = await hub.add_http("h", upstream.port, seed=3)
        await hub.http_fault("h", "reorder", 1.0, 10)
        sent = [f"r{i}".encode() for i in range(8)]
        for body in sent:  # one after another, each sent whole and given up on at once
            _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(
                b"POST /heartbeat HTTP/1.1\r\nHost: x\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            writer.close()

        async def all_in() -> bool:
            return len(upstream.bodies) == len(sent)

        await wait_until(all_in, 5, "every reordered request delivered")
        assert sorted(upstream.bodies) == sorted(sent)
        assert upstream.bodies != sent  # delivered in another order than sent
        assert proxy.stats.reordered == len(sent)


async def test_http_fault_ends_after_its_duration(hub: ProxyHub) -> None:
    async with Upstream() as upstream:
        proxy = await hub.add_http("h", upstream.port)
        await hub.http_fault("h", "hold", 30.0, 1.5)
        with pytest.raises(httpx.TimeoutException):
            await post(proxy.port, b"held", timeout=0.5)

        async def over() -> bool:
            started = time.monotonic()
            try:
                await post(proxy.port, b"x", timeout=3.0)
            except httpx.TimeoutException:
                return False
            return time.monotonic() - started < 3.0

        await wait_until(over, 10, "requests pass unheld after the fault's duration")
        assert proxy.stats.held >= 1
        assert b"held" not in upstream.bodies  # still held (30 s)

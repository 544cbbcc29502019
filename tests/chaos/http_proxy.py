"""An HTTP proxy in front of a coordinator replica that can hold, duplicate and
reorder requests.

The TCP proxies of ``tests/chaos/proxy.py`` keep bytes in order on a connection; a
heartbeat protocol must also survive what happens *between* connections: a request
that reaches the replica after its sender gave up and went on through the other
replica, the same request processed twice, two requests of one member processed in
the opposite order. :class:`HttpProxy` reads each request whole (HTTP/1.1 with a
``Content-Length`` body, what the workers' client sends), forwards it on a fresh
upstream connection (``Connection: close``, so the answer ends at EOF) and relays the
answer; then it closes the client's connection (the client opens another).

Faults, each for a given time (:meth:`HttpProxy.fault`):

* ``hold`` — every request waits ``seconds`` before it is forwarded; a client whose
  timeout passes meanwhile goes on (re-sending to the other replica), and **the held
  request is still delivered** (its answer dropped): a delayed, stale request;
* ``duplicate`` — every request is forwarded once for its client and once more, up
  to ``seconds`` later, on its own connection (that answer dropped);
* ``reorder`` — every request waits a random time in ``[0, seconds]`` and is
  delivered whether or not its client is still waiting: later requests overtake
  earlier ones.

:attr:`HttpProxy.in_flight` counts the requests forwarded and not yet answered, so a
fault can pause the replica with requests inside it. The proxies run on the
:class:`~tests.chaos.proxy.ProxyHub`'s loop (``hub.add_http``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ("FAULTS", "HttpProxy", "HttpProxyStats")

FAULTS = ("hold", "duplicate", "reorder")
_UPSTREAM_TIMEOUT = 60.0  # a paused replica answers late; a dead one never


@dataclass
class HttpProxyStats:
    requests: int = 0
    held: int = 0
    duplicated: int = 0
    reordered: int = 0
    client_left: int = 0  # requests whose sender gave up before the answer
    upstream_failed: int = 0
    order: list[int] = field(default_factory=list)  # arrival numbers, in delivery order


class HttpProxy:
    """``127.0.0.1:<port>`` -> ``127.0.0.1:<upstream_port>``, request by request."""

    def __init__(self, name: str, upstream_port: int, seed: int = 0) -> None:
        self.name = name
        self.upstream_port = upstream_port
        self.port = 0
        self.in_flight = 0
        self.stats = HttpProxyStats()
        self.keep_order = False  # record the delivery order (tests)
        self._rng = random.Random(seed)
        self._fault = ""
        self._seconds = 0.0
        self._until = 0.0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()

    def fault(self, kind: str, seconds: float, duration: float) -> None:
        """``kind`` (one of :data:`FAULTS`) with parameter ``seconds`` for the next
        ``duration`` seconds (a new fault replaces the one in force)."""
        if kind not in FAULTS:
            raise ValueError(f"unknown HTTP fault {kind!r}")
        self._fault, self._seconds = kind, seconds
        self._until = asyncio.get_running_loop().time() + duration

    def heal(self) -> None:
        self._fault, self._until = "", 0.0

    def _current(self) -> str:
        if self._fault and asyncio.get_running_loop().time() < self._until:
            return self._fault
        return ""

    # -- forwarding -------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_request(reader)
            if request is None:
                return
            self.stats.requests += 1
            number = self.stats.requests
            # Delivery is a task of its own: it completes even when the client leaves.
            delivery = asyncio.ensure_future(self._deliver(request, number))
            self._tasks.add(delivery)
            delivery.add_done_callback(self._tasks.discard)
            try:
                answer = await _answer_unless_gone(delivery, reader)
            except ConnectionError:
                self.stats.client_left += 1  # the delivery goes on: a stale request
                return
            if answer is None:
                writer.transport.abort()  # upstream unreachable: the client sees a reset
                return
            writer.write(answer)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _deliver(self, request: bytes, number: int) -> bytes | None:
        fault = self._current()
        if fault == "hold":
            self.stats.held += 1
            await asyncio.sleep(self._seconds)
        elif fault == "reorder":
            self.stats.reordered += 1
            await asyncio.sleep(self._rng.uniform(0, self._seconds))
        answer = await self._forward(request, number)
        if fault == "duplicate":
            self.stats.duplicated += 1
            again = asyncio.ensure_future(self._again(request, number, self._seconds))
            self._tasks.add(again)
            again.add_done_callback(self._tasks.discard)
        return answer

    async def _again(self, request: bytes, number: int, within: float) -> None:
        await asyncio.sleep(self._rng.uniform(0, within))
        await self._forward(request, number)

    async def _forward(self, request: bytes, number: int) -> bytes | None:
        self.in_flight += 1
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.upstream_port), 5
            )
            try:
                if self.keep_order:
                    self.stats.order.append(number)
                writer.write(request)
                await writer.drain()
                return await asyncio.wait_for(reader.read(), _UPSTREAM_TIMEOUT)
            finally:
                writer.transport.abort()
        except (OSError, TimeoutError):
            self.stats.upstream_failed += 1
            return None
        finally:
            self.in_flight -= 1


async def _answer_unless_gone(
    delivery: asyncio.Future[bytes | None], reader: asyncio.StreamReader
) -> bytes | None:
    """The delivery's answer; ConnectionError as soon as the client closes its end
    first (its timeout passed: it went on). The delivery itself is not cancelled."""
    gone = asyncio.ensure_future(reader.read(1))
    try:
        done, _ = await asyncio.wait({delivery, gone}, return_when=asyncio.FIRST_COMPLETED)
        if delivery in done:
            return delivery.result()
        if gone.exception() is not None or gone.result() == b"":
            raise ConnectionError("the client left before the answer")
        return await delivery  # (bytes after a whole request: not from our clients)
    finally:
        gone.cancel()


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request, its head rewritten to ``Connection: close``; None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head[:-4].split(b"\r\n")
    length = 0
    kept = [lines[0]]
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        lowered = name.strip().lower()
        if lowered == b"content-length":
            length = int(value.strip())
        if lowered in (b"connection", b"keep-alive"):
            continue
        kept.append(line)
    kept.append(b"Connection: close")
    body = await reader.readexactly(length) if length else b""
    return b"\r\n".join(kept) + b"\r\n\r\n" + body

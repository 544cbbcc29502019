"""A TCP proxy on 127.0.0.1 that can cut and slow down the connections through it.

Every worker of a chaos run reaches Redis and each coordinator replica through a proxy
of its own (and the producers reach Redis through one), so the harness can inject
network faults on one path at a time:

* :meth:`TcpProxy.cut` closes every live connection at once (a reset) and, for the
  given time, refuses new ones: an accepted connection is reset before a byte goes
  through, which a client sees as ``Connection reset``/EOF, like a refused one;
* :meth:`TcpProxy.delay` adds latency to every byte in both directions (bytes keep
  their order; throughput is not limited, only delayed);
* :meth:`TcpProxy.heal` ends both.

The proxies run on an event loop of their own in a background thread
(:class:`ProxyHub`), so that whatever the harness's own loop does (publishing,
polling, the checker) never stalls the traffic of the processes it is testing.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

import anyio

from tests.chaos.http_proxy import HttpProxy

__all__ = ("ProxyHub", "TcpProxy")

T = TypeVar("T")

_CHUNK = 65536


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            with contextlib.suppress(Exception):
                writer.transport.abort()  # RST, not a graceful FIN
        for task in self.tasks:
            task.cancel()


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``127.0.0.1:<upstream_port>`` (see the module
    docstring). Create and drive it through :class:`ProxyHub`."""

    def __init__(self, name: str, upstream_port: int) -> None:
        self.name = name
        self.upstream_port = upstream_port
        self.port = 0
        self.delay_s = 0.0
        self._cut_until = 0.0  # loop time before which new connections are refused
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        # Counters, for the report.
        self.accepted = 0
        self.refused = 0
        self.cut_links = 0
        self.bytes = 0

    def __repr__(self) -> str:
        return f"TcpProxy({self.name}, :{self.port} -> :{self.upstream_port})"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- control (called on the hub's loop) ---------------------------------------------
    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()
        self._links.clear()

    def cut(self, seconds: float) -> int:
        """Reset every live connection and refuse new ones for ``seconds``; returns how
        many connections were cut."""
        loop = asyncio.get_running_loop()
        self._cut_until = max(self._cut_until, loop.time() + seconds)
        links = list(self._links)
        for link in links:
            link.abort()
        self._links.clear()
        self.cut_links += len(links)
        return len(links)

    def delay(self, ms: float) -> None:
        """Add ``ms`` milliseconds of latency to every byte from now on (0 ends it)."""
        self.delay_s = max(0.0, ms / 1000)

    def retarget(self, upstream_port: int) -> int:
        """Forward new connections to ``upstream_port`` from now on and reset the live
        ones (a failover: clients reconnect and reach the new server); how many."""
        self.upstream_port = upstream_port
        links = list(self._links)
        for link in links:
            link.abort()
        self._links.clear()
        return len(links)

    def heal(self) -> None:
        """End a cut early and remove any delay."""
        self._cut_until = 0.0
        self.delay_s = 0.0

    # -- forwarding -----------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() < self._cut_until:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.upstream_port), 5
            )
        except (OSError, TimeoutError):
            writer.transport.abort()  # upstream down (e.g. Redis restarting): pass it on
            return
        if loop.time() < self._cut_until:  # cut while we were connecting
            self.refused += 1
            for w in (writer, up_writer):
                w.transport.abort()
            return
        self.accepted += 1
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.ensure_future(self._pump(reader, up_writer, link)),
            asyncio.ensure_future(self._pump(up_reader, writer, link)),
        ]
        try:
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            self._links.discard(link)
            link.abort()

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: _Link
    ) -> None:
        """Copy ``src`` to ``dst``, each chunk no earlier than its arrival + the delay
        in force when it arrived (order kept)."""
        loop = asyncio.get_running_loop()
        queue: deque[tuple[float, bytes]] = deque()
        more = asyncio.Event()
        finished = False

        async def send() -> None:
            while True:
                while not queue:
                    if finished:
                        return
                    more.clear()
                    await more.wait()
                due, chunk = queue.popleft()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                dst.write(chunk)
                await dst.drain()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                chunk = await src.read(_CHUNK)
                if not chunk:
                    break
                self.bytes += len(chunk)
                queue.append((loop.time() + self.delay_s, chunk))
                more.set()
                if sender.done():
                    break
            finished = True
            more.set()
            await sender
            with contextlib.suppress(Exception):
                dst.write_eof()
        except (OSError, asyncio.IncompleteReadError):
            link.abort()
        finally:
            if not sender.done():
                sender.cancel()
            if sender.done() and not sender.cancelled() and sender.exception() is not None:
                link.abort()


class ProxyHub:
    """Proxies on an event loop in a background thread; every method may be called
    from the harness's own loop (``await``) and takes effect on the hub's loop."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="chaos-proxies", daemon=True)
        self.proxies: dict[str, TcpProxy] = {}
        self.http: dict[str, HttpProxy] = {}  # request-level proxies (http_proxy.py)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        with anyio.fail_after(10):
            return await asyncio.wrap_future(future)

    async def add(self, name: str, upstream_port: int) -> TcpProxy:
        proxy = TcpProxy(name, upstream_port)
        await self._call(proxy.start())
        self.proxies[name] = proxy
        return proxy

    async def add_http(self, name: str, upstream_port: int, seed: int = 0) -> HttpProxy:
        proxy = HttpProxy(name, upstream_port, seed)
        await self._call(proxy.start())
        self.http[name] = proxy
        return proxy

    async def http_fault(self, name: str, kind: str, seconds: float, duration: float) -> None:
        async def go() -> None:
            self.http[name].fault(kind, seconds, duration)

        await self._call(go())

    async def cut(self, name: str, seconds: float) -> int:
        async def go() -> int:
            return self.proxies[name].cut(seconds)

        return await self._call(go())

    async def delay(self, name: str, ms: float) -> None:
        async def go() -> None:
            self.proxies[name].delay(ms)

        await self._call(go())

    async def retarget(self, names: list[str], upstream_port: int) -> int:
        async def go() -> int:
            return sum(self.proxies[name].retarget(upstream_port) for name in names)

        return await self._call(go())

    async def heal(self, name: str | None = None) -> None:
        async def go() -> None:
            for proxy in [self.proxies[name]] if name else self.proxies.values():
                proxy.heal()
            if not name:
                for http in self.http.values():
                    http.heal()

        await self._call(go())

    def close(self) -> None:
        async def go() -> None:
            for proxy in self.proxies.values():
                await proxy.close()
            for http in self.http.values():
                await http.close()

        if self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(go(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        deadline = time.monotonic() + 5
        while self._loop.is_running() and time.monotonic() < deadline:  # pragma: no cover
            time.sleep(0.01)
        if not self._loop.is_running():
            self._loop.close()

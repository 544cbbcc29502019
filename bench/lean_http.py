"""A minimal keep-alive HTTP/1.1 JSON client for load generation.

httpx spends about a millisecond of CPU per request, which on a 2-core machine makes
the load generator, not the server, the bottleneck. This client writes requests by
hand and parses only the status line, Content-Length and body: it exists only to
measure the coordinator, never to talk to anything else.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson


class LeanConnection:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        if self._writer is None:
            await self._open()
        assert self._reader is not None and self._writer is not None
        payload = orjson.dumps(body)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        self._writer.write(head + payload)
        try:
            status_line = await self._reader.readline()
        except ConnectionResetError:  # closed idle, and our request hit it (a reset)
            status_line = b""
        if not status_line:
            # The server closed the idle keep-alive connection (uvicorn: after 5 s):
            # open a new one and send the request again.
            self._writer.close()
            await self._open()
            assert self._reader is not None and self._writer is not None
            self._writer.write(head + payload)
            status_line = await self._reader.readline()
        status = int(status_line.split(b" ", 2)[1])
        length = 0
        while True:
            line = await self._reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        data = await self._reader.readexactly(length)
        return status, orjson.loads(data) if data else None

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()

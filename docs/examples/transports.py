"""The coordinator's two transports: the HTTP client and the in-process one."""

from __future__ import annotations

import anyio

from streamworks import App
from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.local import LocalTransport
from streamworks.protocol.transport import CoordinatorTransport
from streamworks.testing import TestRuntime

app = App("billing")
app.stream("invoices", shards=2)


async def shard_count(coordinator: CoordinatorTransport, stream: str) -> int:
    """Code written against the seam runs over either transport."""
    return (await coordinator.stream(stream)).shard_count


async def main() -> None:
    async with TestRuntime(app, workers=0, http=True) as rt:  # a real HTTP server
        assert rt.http_url is not None and rt.service is not None
        async with CoordinatorClient([rt.http_url]) as http:
            local = LocalTransport(rt.service)  # the same service, without HTTP
            assert await shard_count(http, "invoices") == 2
            assert await shard_count(local, "invoices") == 2

            scaled = await http.scale_stream("invoices", 3)  # POST /v1/streams/invoices/scale
            assert scaled.shard_count == 3
            assert await shard_count(local, "invoices") == 3


if __name__ == "__main__":
    anyio.run(main)

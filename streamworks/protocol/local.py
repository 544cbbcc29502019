"""In-process transport: a :class:`CoordinatorTransport` calling a coordinator directly.

``TestRuntime`` uses it so tests run the real coordinator logic without HTTP (or
real HTTP when asked). Requests and answers are the same typed models as on the
wire, and errors are the same :class:`~streamworks.exceptions.CoordinatorError`.
It calls any :class:`~streamworks.protocol.api.CoordinatorApi` (the coordinator's
service is one), so the protocol package needs nothing from the coordinator's.
"""

from __future__ import annotations

from streamworks.protocol.api import CoordinatorApi
from streamworks.protocol.control import (
    GroupInfo,
    HeartbeatRequest,
    HeartbeatResponse,
    ReinitializeRequest,
    RoutingResponse,
    StatusResponse,
    StreamInfo,
    UnsubscribeRequest,
)

__all__ = ("LocalTransport",)


class LocalTransport:
    """Calls a coordinator (a :class:`CoordinatorApi`) in this process.

    Args:
        service: the coordinator, e.g. a ``CoordinatorService``.
    """

    def __init__(self, service: CoordinatorApi) -> None:
        self.service = service

    async def aclose(self) -> None:
        return None

    async def heartbeat(self, group: str, request: HeartbeatRequest) -> HeartbeatResponse:
        # Round-trip through the wire format, so in-process tests exercise the same
        # validation as HTTP clients.
        wire = HeartbeatRequest.model_validate(request.model_dump(by_alias=True))
        return await self.service.heartbeat(group, wire)

    async def routing(self, stream: str) -> RoutingResponse:
        return await self.service.routing(stream)

    async def ensure_stream(self, name: str, shards: int) -> StreamInfo:
        return await self.service.ensure_stream(name, shards)

    async def create_stream(self, name: str, shards: int) -> StreamInfo:
        return await self.service.create_stream(name, shards)

    async def scale_stream(self, name: str, shards: int) -> StreamInfo:
        return await self.service.scale_stream(name, shards)

    async def unsubscribe(self, request: UnsubscribeRequest) -> StatusResponse:
        return await self.service.unsubscribe(request)

    async def reinitialize(self, request: ReinitializeRequest) -> StatusResponse:
        return await self.service.reinitialize(request)

    async def streams(self) -> list[StreamInfo]:
        return (await self.service.status()).streams

    async def stream(self, name: str) -> StreamInfo:
        return await self.service.stream_info(name)

    async def group(self, name: str) -> GroupInfo:
        return await self.service.group_info(name)

    async def status(self) -> StatusResponse:
        return await self.service.status()

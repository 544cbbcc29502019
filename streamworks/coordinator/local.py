"""In-process transport: the coordinator client's interface, calling a service directly.

``TestRuntime`` uses it so tests run the real coordinator logic without HTTP (or
real HTTP when asked). Requests and answers are the same typed models as on the
wire, and errors are the same :class:`~streamworks.exceptions.CoordinatorError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from streamworks.coordinator.service import CoordinatorService

__all__ = ("LocalTransport",)


class LocalTransport:
    """Calls a :class:`CoordinatorService` in this process."""

    def __init__(self, service: CoordinatorService) -> None:
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

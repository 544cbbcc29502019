"""The one seam between members (and producers, and the CLI) and the coordinator.

Members, producers and the CLI reach the coordinator only through a
:class:`CoordinatorTransport`. It has two implementations: the HTTP client
(:class:`~streamworks.protocol.client.CoordinatorClient`) and the in-process
transport (:class:`~streamworks.protocol.local.LocalTransport`) that ``TestRuntime``
uses. Both speak the same typed models and raise the same
:class:`~streamworks.exceptions.CoordinatorError` codes.
"""

from __future__ import annotations

from typing import Protocol

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

__all__ = ("CoordinatorTransport",)


class CoordinatorTransport(Protocol):
    """What a client can ask of the coordinator.

    Every method raises :class:`~streamworks.exceptions.CoordinatorError` when the
    coordinator refuses (its code says why) and
    :class:`~streamworks.exceptions.CoordinatorUnavailableError` when none answers.
    """

    # -- members and producers ---------------------------------------------------------
    async def heartbeat(self, group: str, request: HeartbeatRequest, /) -> HeartbeatResponse:
        """Report the member's state to its group and receive its assignment."""
        ...

    async def routing(self, stream: str, /) -> RoutingResponse:
        """The stream's routing table, leased for ``lease_ms``."""
        ...

    async def ensure_stream(self, name: str, shards: int, /) -> StreamInfo:
        """Create ``name`` if it does not exist (an app's declaration); never rescales."""
        ...

    # -- topology (admin) --------------------------------------------------------------
    async def create_stream(self, name: str, shards: int, /) -> StreamInfo:
        """Create a stream (``ALREADY_EXISTS`` if it exists with another shard count)."""
        ...

    async def scale_stream(self, name: str, shards: int, /) -> StreamInfo:
        """Change a stream's shard count (a live migration)."""
        ...

    async def unsubscribe(self, request: UnsubscribeRequest, /) -> StatusResponse:
        """A group stops consuming a stream for good (an operator's action)."""
        ...

    async def reinitialize(self, request: ReinitializeRequest, /) -> StatusResponse:
        """Re-create a stream's or group's lost metadata (an operator's recovery)."""
        ...

    # -- reading -------------------------------------------------------------------------
    async def streams(self) -> list[StreamInfo]:
        """Every stream."""
        ...

    async def stream(self, name: str, /) -> StreamInfo:
        """One stream."""
        ...

    async def group(self, name: str, /) -> GroupInfo:
        """One group."""
        ...

    async def status(self) -> StatusResponse:
        """Every stream and group."""
        ...

    async def aclose(self) -> None:
        """Release the transport's resources (connections)."""
        ...

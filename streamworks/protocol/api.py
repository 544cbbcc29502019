"""The coordinator's API (v1), defined once: each endpoint and the service behind it.

Every endpoint is an :class:`Endpoint` here — method, path template, request and
response models, and whether it needs the admin token. The HTTP client
(:mod:`streamworks.protocol.client`) builds its requests from these definitions and
the coordinator's HTTP server (``streamworks.coordinator.http``) registers its
routes from them, so the two cannot drift apart. :class:`CoordinatorApi` is the
server-side operations the endpoints call; the coordinator's service satisfies it
structurally, and the in-process transport (:mod:`streamworks.protocol.local`)
calls it directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, TypeAdapter

from streamworks.protocol.control import (
    GroupInfo,
    HeartbeatRequest,
    HeartbeatResponse,
    ReinitializeRequest,
    RoutingResponse,
    StatusResponse,
    StreamCreateRequest,
    StreamInfo,
    StreamScaleRequest,
    UnsubscribeRequest,
)

__all__ = (
    "CREATE_STREAM",
    "ENDPOINTS",
    "ENSURE_STREAM",
    "HEARTBEAT",
    "LIST_GROUPS",
    "LIST_STREAMS",
    "REINITIALIZE",
    "ROUTING",
    "SCALE_STREAM",
    "SHOW_GROUP",
    "SHOW_STREAM",
    "STATUS",
    "UNSUBSCRIBE",
    "CoordinatorApi",
    "Endpoint",
)

# Covariant: an endpoint is read-only, so every one of them is an ``Endpoint[BaseModel | None,
# object]`` (the type of ``ENDPOINTS``).
RequestT = TypeVar("RequestT", bound=BaseModel | None, covariant=True)
ResponseT = TypeVar("ResponseT", covariant=True)

_PARAMETER = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True)
class Endpoint(Generic[RequestT, ResponseT]):
    """One endpoint of the API.

    Attributes:
        name: the operation's name (also the route's name in the OpenAPI document).
        method: ``GET`` or ``POST``.
        path: the path template; each ``{parameter}`` is a group or stream name.
        request: the JSON body's model, or ``None`` for an endpoint without a body.
        response: the model (or ``list[...]`` of models) of a successful answer.
        admin: whether the admin token is required (topology changes).
    """

    name: str
    method: Literal["GET", "POST"]
    path: str
    request: type[RequestT] | None
    response: type[ResponseT]
    admin: bool = False
    parameters: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", tuple(_PARAMETER.findall(self.path)))

    def url(self, **parameters: str) -> str:
        """The path with its parameters filled in (exactly those of the template)."""
        if set(parameters) != set(self.parameters):
            raise ValueError(
                f"{self.name} takes path parameters {self.parameters}, got {sorted(parameters)}"
            )
        return self.path.format(**parameters)

    @cached_property
    def response_adapter(self) -> TypeAdapter[ResponseT]:
        """Validates an answer's JSON body."""
        return TypeAdapter(self.response)


# -- members and producers -------------------------------------------------------------
HEARTBEAT = Endpoint(
    "heartbeat", "POST", "/v1/groups/{group}/heartbeat", HeartbeatRequest, HeartbeatResponse
)
ROUTING = Endpoint[None, RoutingResponse](
    "routing", "GET", "/v1/streams/{stream}/routing", None, RoutingResponse
)
#: Create a stream if it does not exist (an app's declaration); never rescales.
ENSURE_STREAM = Endpoint(
    "ensure_stream", "POST", "/v1/streams/ensure", StreamCreateRequest, StreamInfo
)

# -- topology (admin) ------------------------------------------------------------------
CREATE_STREAM = Endpoint(
    "create_stream", "POST", "/v1/streams", StreamCreateRequest, StreamInfo, admin=True
)
SCALE_STREAM = Endpoint(
    "scale_stream",
    "POST",
    "/v1/streams/{stream}/scale",
    StreamScaleRequest,
    StreamInfo,
    admin=True,
)
UNSUBSCRIBE = Endpoint(
    "unsubscribe",
    "POST",
    "/v1/admin/unsubscribe",
    UnsubscribeRequest,
    StatusResponse,
    admin=True,
)
REINITIALIZE = Endpoint(
    "reinitialize",
    "POST",
    "/v1/admin/reinitialize",
    ReinitializeRequest,
    StatusResponse,
    admin=True,
)

# -- reading ---------------------------------------------------------------------------
LIST_STREAMS = Endpoint[None, list[StreamInfo]](
    "list_streams", "GET", "/v1/streams", None, list[StreamInfo]
)
SHOW_STREAM = Endpoint[None, StreamInfo](
    "show_stream", "GET", "/v1/streams/{stream}", None, StreamInfo
)
LIST_GROUPS = Endpoint[None, list[GroupInfo]](
    "list_groups", "GET", "/v1/groups", None, list[GroupInfo]
)
SHOW_GROUP = Endpoint[None, GroupInfo]("show_group", "GET", "/v1/groups/{group}", None, GroupInfo)
STATUS = Endpoint[None, StatusResponse]("status", "GET", "/v1/status", None, StatusResponse)

#: Every endpoint of the API, in the order the server registers them.
ENDPOINTS: tuple[Endpoint[BaseModel | None, object], ...] = (
    HEARTBEAT,
    ROUTING,
    ENSURE_STREAM,
    CREATE_STREAM,
    SCALE_STREAM,
    UNSUBSCRIBE,
    REINITIALIZE,
    LIST_STREAMS,
    SHOW_STREAM,
    LIST_GROUPS,
    SHOW_GROUP,
    STATUS,
)


class CoordinatorApi(Protocol):
    """The operations a coordinator exposes, as the endpoints call them.

    Positional-only, so an implementation may name its parameters as it likes.
    Group and stream names arrive validated against the name pattern.
    """

    async def heartbeat(self, group: str, request: HeartbeatRequest, /) -> HeartbeatResponse: ...

    async def routing(self, stream: str, /) -> RoutingResponse: ...

    async def ensure_stream(self, name: str, shards: int, /) -> StreamInfo: ...

    async def create_stream(self, name: str, shards: int, /) -> StreamInfo: ...

    async def scale_stream(self, name: str, shards: int, /) -> StreamInfo: ...

    async def unsubscribe(self, request: UnsubscribeRequest, /) -> StatusResponse: ...

    async def reinitialize(self, request: ReinitializeRequest, /) -> StatusResponse: ...

    async def status(self) -> StatusResponse: ...

    async def stream_info(self, name: str, /) -> StreamInfo: ...

    async def group_info(self, group: str, /) -> GroupInfo: ...

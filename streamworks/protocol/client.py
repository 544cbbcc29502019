"""HTTP client of the coordinator API, used by workers, producers and the CLI.

One of the two :class:`~streamworks.protocol.transport.CoordinatorTransport`
implementations; every request is built from the endpoint's definition in
:mod:`streamworks.protocol.api` (method, path, body and answer models, token).

Several coordinator URLs may be given (or one load-balanced URL). A request goes to
the last URL that answered; on a connection failure or a retryable refusal such as
``COORDINATOR_TERMINATING`` it moves on to the next, so a rolling update of the
replicas is invisible to clients beyond one retry.

Moving on re-sends the very same body: a heartbeat keeps its sequence number, so when
the first replica did receive it (a timeout, not a refused connection) and acts on it
late, at most one of the copies acts (the coordinator ignores a number it acted on).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar

import httpx
import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from streamworks.exceptions import CoordinatorError, CoordinatorUnavailableError
from streamworks.protocol import api
from streamworks.protocol.api import Endpoint
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

__all__ = ("CoordinatorClient",)

log = logging.getLogger("streamworks.coordinator.client")
M = TypeVar("M")
RequestT = TypeVar("RequestT", bound=BaseModel | None)
ResponseT = TypeVar("ResponseT")

#: Refusals worth trying on another replica at once.
_TRY_ELSEWHERE = {"COORDINATOR_TERMINATING"}
#: Seconds an idle connection to a coordinator is kept for the next request: longer
#: than any sane heartbeat interval, and below the server's keep-alive
#: (``coordinator.http_keep_alive`` > 60 s), so the client always lets go first.
CLIENT_KEEPALIVE = 60.0


class CoordinatorClient:
    """Talks to one or more coordinator replicas over HTTP.

    Args:
        urls: base URLs (``http://host:7400``); tried in turn.
        token: bearer token for ordinary requests.
        admin_token: bearer token for topology changes (falls back to ``token``).
        timeout: seconds per HTTP request.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        token: str | None = None,
        admin_token: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        if not urls:
            raise ValueError("at least one coordinator URL is required")
        self.urls = [u.rstrip("/") for u in urls]
        self._token = token
        self._admin_token = admin_token or token
        self._current = 0
        self._http = httpx.AsyncClient(
            timeout=timeout,
            limits=httpx.Limits(max_keepalive_connections=8, keepalive_expiry=CLIENT_KEEPALIVE),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> CoordinatorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        model: TypeAdapter[M],
        body: BaseModel | None,
        *,
        admin: bool,
    ) -> M:
        token = self._admin_token if admin else self._token
        headers = {"content-type": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        # Encoded once: every replica tried gets the same bytes (a heartbeat's sequence
        # number included, so the coordinator acts on at most one copy).
        content = (
            orjson.dumps(body.model_dump(mode="json", by_alias=True, exclude_none=True))
            if body is not None
            else None
        )
        last: Exception | None = None
        for attempt in range(len(self.urls)):
            index = (self._current + attempt) % len(self.urls)
            url = self.urls[index] + path
            try:
                response = await self._http.request(method, url, content=content, headers=headers)
            except httpx.TransportError as e:
                last = e
                log.debug("coordinator %s unreachable: %s", self.urls[index], e)
                continue
            if response.status_code < 400:
                self._current = index
                try:
                    return model.validate_json(response.content)
                except ValidationError as e:
                    raise CoordinatorError(
                        "INVALID_RESPONSE", f"{url} answered an unexpected body: {e}"
                    ) from e
            error = _error_of(response)
            if error.code in _TRY_ELSEWHERE and attempt + 1 < len(self.urls):
                last = error
                continue
            raise error
        if isinstance(last, CoordinatorError):
            raise last
        raise CoordinatorUnavailableError(
            f"no coordinator answered ({', '.join(self.urls)}): {last}"
        )

    async def _call(
        self, endpoint: Endpoint[RequestT, ResponseT], body: RequestT, **parameters: str
    ) -> ResponseT:
        if (body is None) != (endpoint.request is None) or (
            endpoint.request is not None and not isinstance(body, endpoint.request)
        ):
            raise TypeError(f"{endpoint.name} takes a {endpoint.request} body, not {body!r}")
        return await self._request(
            endpoint.method,
            endpoint.url(**parameters),
            endpoint.response_adapter,
            body,
            admin=endpoint.admin,
        )

    # -- members and producers ---------------------------------------------------------
    async def heartbeat(self, group: str, request: HeartbeatRequest) -> HeartbeatResponse:
        return await self._call(api.HEARTBEAT, request, group=group)

    async def routing(self, stream: str) -> RoutingResponse:
        return await self._call(api.ROUTING, None, stream=stream)

    async def ensure_stream(self, name: str, shards: int) -> StreamInfo:
        """Create ``name`` if it does not exist (an app's declaration); never rescales."""
        return await self._call(api.ENSURE_STREAM, StreamCreateRequest(name=name, shards=shards))

    # -- topology (admin) --------------------------------------------------------------
    async def create_stream(self, name: str, shards: int) -> StreamInfo:
        return await self._call(api.CREATE_STREAM, StreamCreateRequest(name=name, shards=shards))

    async def scale_stream(self, name: str, shards: int) -> StreamInfo:
        return await self._call(api.SCALE_STREAM, StreamScaleRequest(shards=shards), stream=name)

    async def unsubscribe(self, request: UnsubscribeRequest) -> StatusResponse:
        return await self._call(api.UNSUBSCRIBE, request)

    async def reinitialize(self, request: ReinitializeRequest) -> StatusResponse:
        return await self._call(api.REINITIALIZE, request)

    # -- reading -------------------------------------------------------------------------
    async def streams(self) -> list[StreamInfo]:
        return (await self.status()).streams

    async def stream(self, name: str) -> StreamInfo:
        return await self._call(api.SHOW_STREAM, None, stream=name)

    async def group(self, name: str) -> GroupInfo:
        return await self._call(api.SHOW_GROUP, None, group=name)

    async def status(self) -> StatusResponse:
        return await self._call(api.STATUS, None)


def _error_of(response: httpx.Response) -> CoordinatorError:
    try:
        body: Any = orjson.loads(response.content)
        code = str(body["error"])
        message = str(body.get("message", ""))
        retryable = bool(body.get("retryable", False))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        code = "HTTP_" + str(response.status_code)
        message = response.text[:200]
        retryable = response.status_code >= 500
    return CoordinatorError(code, message, retryable=retryable, status=response.status_code)

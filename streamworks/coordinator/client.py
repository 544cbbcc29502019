"""HTTP client of the coordinator API, used by workers, producers and the CLI.

Several coordinator URLs may be given (or one load-balanced URL). A request goes to
the last URL that answered; on a connection failure or a retryable refusal such as
``COORDINATOR_TERMINATING`` it moves on to the next, so a rolling update of the
replicas is invisible to clients beyond one retry.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar

import httpx
import orjson
from pydantic import BaseModel, ValidationError

from streamworks.exceptions import CoordinatorError, CoordinatorUnavailableError
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
M = TypeVar("M", bound=BaseModel)

#: Refusals worth trying on another replica at once.
_TRY_ELSEWHERE = {"COORDINATOR_TERMINATING"}


class CoordinatorClient:
    """Talks to one or more coordinator replicas.

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
            timeout=timeout, limits=httpx.Limits(max_keepalive_connections=8)
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
        model: type[M],
        body: BaseModel | None = None,
        *,
        admin: bool = False,
    ) -> M:
        token = self._admin_token if admin else self._token
        headers = {"content-type": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
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
                    return model.model_validate_json(response.content)
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

    # -- members and producers ---------------------------------------------------------
    async def heartbeat(self, group: str, request: HeartbeatRequest) -> HeartbeatResponse:
        return await self._request(
            "POST", f"/v1/groups/{group}/heartbeat", HeartbeatResponse, request
        )

    async def routing(self, stream: str) -> RoutingResponse:
        return await self._request("GET", f"/v1/streams/{stream}/routing", RoutingResponse)

    async def ensure_stream(self, name: str, shards: int) -> StreamInfo:
        """Create ``name`` if it does not exist (an app's declaration); never rescales."""
        return await self._request(
            "POST", "/v1/streams/ensure", StreamInfo, StreamCreateRequest(name=name, shards=shards)
        )

    # -- topology (admin) --------------------------------------------------------------
    async def create_stream(self, name: str, shards: int) -> StreamInfo:
        return await self._request(
            "POST",
            "/v1/streams",
            StreamInfo,
            StreamCreateRequest(name=name, shards=shards),
            admin=True,
        )

    async def scale_stream(self, name: str, shards: int) -> StreamInfo:
        return await self._request(
            "POST",
            f"/v1/streams/{name}/scale",
            StreamInfo,
            StreamScaleRequest(shards=shards),
            admin=True,
        )

    async def unsubscribe(self, request: UnsubscribeRequest) -> StatusResponse:
        return await self._request(
            "POST", "/v1/admin/unsubscribe", StatusResponse, request, admin=True
        )

    async def reinitialize(self, request: ReinitializeRequest) -> StatusResponse:
        return await self._request(
            "POST", "/v1/admin/reinitialize", StatusResponse, request, admin=True
        )

    # -- reading -------------------------------------------------------------------------
    async def streams(self) -> list[StreamInfo]:
        return (await self._request("GET", "/v1/status", StatusResponse)).streams

    async def stream(self, name: str) -> StreamInfo:
        return await self._request("GET", f"/v1/streams/{name}", StreamInfo)

    async def group(self, name: str) -> GroupInfo:
        return await self._request("GET", f"/v1/groups/{name}", GroupInfo)

    async def status(self) -> StatusResponse:
        return await self._request("GET", "/v1/status", StatusResponse)


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

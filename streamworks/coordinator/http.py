"""The coordinator's HTTP API (v1): a thin ASGI shell over :class:`CoordinatorService`.

Each route is registered from its endpoint's definition in
:mod:`streamworks.protocol.api` (path, method, models, token), the same definitions
the HTTP client builds its requests from.

Errors are always ``{"error": CODE, "message": ..., "retryable": ...}`` (docs/protocol.md#http-api).
Requests need ``Authorization: Bearer <token>`` when a token is configured, and the
admin token for topology changes; tokens are compared in constant time and never
logged or echoed. ``/livez``, ``/readyz`` and ``/metrics`` need no token.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import uvicorn
from fastapi import Depends, FastAPI, Request, params
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from streamworks.coordinator.dashboard import dashboard_router
from streamworks.coordinator.http_heartbeat import HeartbeatRoute
from streamworks.coordinator.observation import Observer
from streamworks.exceptions import CoordinatorError
from streamworks.protocol import api as endpoints
from streamworks.protocol.api import Endpoint
from streamworks.protocol.control import (
    ApiError,
    ErrorCode,
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
from streamworks.protocol.shards import NAME_PATTERN

if TYPE_CHECKING:
    from streamworks.coordinator.service import CoordinatorService
    from streamworks.settings import Settings

__all__ = ("QuietServer", "create_api", "server_config")

log = logging.getLogger("streamworks.coordinator")

RequestT = TypeVar("RequestT", bound="BaseModel | None")
ResponseT = TypeVar("ResponseT")
#: A route's validated path parameters, by name (``group``, ``stream``).
Path = Mapping[str, str]
#: What a route runs: its path parameters and body in, its answer out.
Handler = Callable[[Path, RequestT], Awaitable[ResponseT]]


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its owner (the coordinator
    command enters terminating mode on SIGTERM before the server stops; a test runtime
    must not take over the test process's signals)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def server_config(app: FastAPI, settings: Settings, **options: Any) -> uvicorn.Config:
    """The uvicorn configuration of a coordinator replica serving ``app``: quiet, no
    lifespan, idle connections kept ``coordinator.http_keep_alive`` seconds (uvicorn's
    5 s would reconnect every heartbeat of members at longer intervals)."""
    return uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",
        access_log=False,
        timeout_keep_alive=int(settings.coordinator.http_keep_alive),
        **options,
    )


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ApiError} for status in (400, 401, 404, 409, 413, 422, 503)
}

#: The largest request body accepted. A heartbeat of a member owning 10,000 shards is
#: about 200 KB; anything far larger is a broken or hostile client, refused before it is
#: read into memory.
MAX_BODY = 4 * 1024 * 1024


class _BodyLimit:
    """ASGI middleware: 413 for a body over ``MAX_BODY`` bytes, whether announced by
    ``Content-Length`` or sent chunked (counted as it arrives)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_large = int(value) > MAX_BODY
                except ValueError:
                    too_large = False  # the server refuses a malformed length itself
                if too_large:
                    await _too_large()(scope, receive, send)
                    return
        received = 0

        async def limited() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_BODY:
                    raise StarletteHTTPException(413, _TOO_LARGE)
            return message

        await self.app(scope, limited, send)


_TOO_LARGE = f"request body larger than {MAX_BODY} bytes"


def _too_large() -> JSONResponse:
    return _error(ErrorCode.INVALID_REQUEST, _TOO_LARGE, 413, False)


def _error(code: ErrorCode | str, message: str, status: int, retryable: bool) -> JSONResponse:
    return JSONResponse(
        {"error": str(code), "message": message, "retryable": retryable}, status_code=status
    )


def create_api(service: CoordinatorService) -> FastAPI:
    """Build the ASGI app for one coordinator replica."""
    settings = service.settings
    token = settings.token.get_secret_value() if settings.token else None
    admin_token = settings.admin_token.get_secret_value() if settings.admin_token else token
    api = FastAPI(
        title="streamworks coordinator",
        version="1",
        docs_url=None,
        redoc_url=None,
    )

    def _authorize(header: str, expected: str | None) -> None:
        if expected is None:
            return
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
            presented.encode(), expected.encode()
        ):
            raise CoordinatorError("UNAUTHORIZED", "missing or wrong bearer token", status=401)

    def _check(request: Request, expected: str | None) -> None:
        _authorize(request.headers.get("authorization", ""), expected)

    # The heartbeat route answered before the framework (http_heartbeat.py), inside the
    # body limit (middleware added later wraps the earlier).
    api.add_middleware(
        HeartbeatRoute,
        service=service,
        authorize=lambda header: _authorize(header, token),
        max_body=MAX_BODY,
    )
    api.add_middleware(_BodyLimit)
    observer = Observer(service)  # status snapshots: /metrics gauges and the dashboard
    api.include_router(dashboard_router(service, observer))

    # Async dependencies: FastAPI would run plain functions in a worker thread.
    async def member_auth(request: Request) -> None:
        _check(request, token)

    async def admin_auth(request: Request) -> None:
        _check(request, admin_token)

    member = [Depends(member_auth)]
    admin = [Depends(admin_auth)]

    def _name(kind: str, value: str) -> str:
        if not NAME_PATTERN.fullmatch(value):
            raise CoordinatorError(
                "INVALID_REQUEST", f"invalid {kind} name {value[:100]!r}", status=400
            )
        return value

    @api.exception_handler(CoordinatorError)
    async def coordinator_error(_: Request, exc: CoordinatorError) -> JSONResponse:
        return _error(exc.code, exc.message, exc.status or 500, exc.retryable)

    @api.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI decodes a JSON body before it runs the route's dependencies, so an
        # unparsable body would be answered before the token is checked: check it here
        # too, so an unauthenticated caller learns nothing about the API but 401.
        for dependency in getattr(request.scope.get("route"), "dependencies", ()):
            try:
                await dependency.dependency(request)
            except CoordinatorError as e:
                return _error(e.code, e.message, e.status or 401, e.retryable)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"
            for e in exc.errors()[:5]
        )
        return _error(ErrorCode.INVALID_REQUEST, problems[:1000], 422, False)

    @api.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = ErrorCode.NOT_FOUND if exc.status_code == 404 else ErrorCode.INVALID_REQUEST
        return _error(code, str(exc.detail), exc.status_code, False)

    # Redis restarting, loading its dataset, or cut off: an outage to retry, not a bug.
    # Registered for these types, the error is answered here, and not re-raised to the
    # server (which would log a traceback for every request during the outage).
    async def redis_unavailable(_: Request, exc: Exception) -> JSONResponse:
        service.metrics.unavailable.inc()
        log.warning("request refused: Redis unavailable (%s)", type(exc).__name__)
        return _error(
            ErrorCode.METADATA_UNAVAILABLE,
            f"Redis unavailable ({type(exc).__name__}); retry",
            503,
            True,
        )

    api.add_exception_handler(RedisConnectionError, redis_unavailable)
    api.add_exception_handler(RedisTimeoutError, redis_unavailable)

    @api.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        service.log_unexpected(exc)
        return _error(ErrorCode.INTERNAL, "internal error (see the coordinator's log)", 500, True)

    def route(
        endpoint: Endpoint[RequestT, ResponseT],
    ) -> Callable[[Handler[RequestT, ResponseT]], Handler[RequestT, ResponseT]]:
        """Register a handler for ``endpoint`` under its path, method, models and token."""

        def register(handler: Handler[RequestT, ResponseT]) -> Handler[RequestT, ResponseT]:
            _add_route(api, endpoint, handler, admin if endpoint.admin else member, _name)
            return handler

        return register

    # -- members and producers ---------------------------------------------------------
    @route(endpoints.HEARTBEAT)
    async def heartbeat(path: Path, body: HeartbeatRequest) -> HeartbeatResponse:
        return await service.heartbeat(path["group"], body)

    @route(endpoints.ROUTING)
    async def routing(path: Path, _: None) -> RoutingResponse:
        return await service.routing(path["stream"])

    @route(endpoints.ENSURE_STREAM)
    async def ensure_stream(_: Path, body: StreamCreateRequest) -> StreamInfo:
        return await service.ensure_stream(body.name, body.shards)

    # -- topology ------------------------------------------------------------------------
    @route(endpoints.CREATE_STREAM)
    async def create_stream(_: Path, body: StreamCreateRequest) -> StreamInfo:
        return await service.create_stream(body.name, body.shards)

    @route(endpoints.SCALE_STREAM)
    async def scale_stream(path: Path, body: StreamScaleRequest) -> StreamInfo:
        return await service.scale_stream(path["stream"], body.shards)

    @route(endpoints.UNSUBSCRIBE)
    async def unsubscribe(_: Path, body: UnsubscribeRequest) -> StatusResponse:
        return await service.unsubscribe(body)

    @route(endpoints.REINITIALIZE)
    async def reinitialize(_: Path, body: ReinitializeRequest) -> StatusResponse:
        return await service.reinitialize(body)

    # -- reading -------------------------------------------------------------------------
    @route(endpoints.LIST_STREAMS)
    async def list_streams(_: Path, __: None) -> list[StreamInfo]:
        return (await service.status()).streams

    @route(endpoints.SHOW_STREAM)
    async def show_stream(path: Path, _: None) -> StreamInfo:
        return await service.stream_info(path["stream"])

    @route(endpoints.LIST_GROUPS)
    async def list_groups(_: Path, __: None) -> list[GroupInfo]:
        return (await service.status()).groups

    @route(endpoints.SHOW_GROUP)
    async def show_group(path: Path, _: None) -> GroupInfo:
        return await service.group_info(path["group"])

    @route(endpoints.STATUS)
    async def status(_: Path, __: None) -> StatusResponse:
        return await service.status()

    # -- the root: people who open the coordinator's address want the dashboard --------
    @api.get("/", include_in_schema=False)
    async def root() -> Response:
        return RedirectResponse("/ui/", status_code=307)

    # -- health ----------------------------------------------------------------------------
    @api.get("/livez", response_class=PlainTextResponse)
    async def livez() -> str:
        return "ok"

    @api.get("/readyz", response_class=PlainTextResponse, responses={503: {"model": ApiError}})
    async def readyz() -> Response:
        if service.terminating:
            return _error(ErrorCode.COORDINATOR_TERMINATING, "terminating", 503, True)
        if not await service.redis_ok():
            return _error(ErrorCode.METADATA_UNAVAILABLE, "Redis does not answer", 503, True)
        if service.identity.problem is not None:  # Redis lost the namespace's data
            return _error(ErrorCode.METADATA_UNAVAILABLE, service.identity.problem, 503, False)
        return PlainTextResponse("ok")

    @api.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        await observer.observe()
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return api


def _add_route(
    api: FastAPI,
    endpoint: Endpoint[RequestT, ResponseT],
    handler: Handler[RequestT, ResponseT],
    dependencies: Sequence[params.Depends],
    valid_name: Callable[[str, str], str],
) -> None:
    # FastAPI reads a route's parameters from its function's signature: give it one
    # made from the endpoint (each path parameter a string, the body its model), so
    # nothing of the endpoint is written twice.
    parameters = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str)
        for name in endpoint.parameters
    ]
    if endpoint.request is not None:
        parameters.append(
            inspect.Parameter("body", inspect.Parameter.KEYWORD_ONLY, annotation=endpoint.request)
        )

    async def call(**values: object) -> ResponseT:
        body = cast(RequestT, values.pop("body", None))
        # Every path parameter is a group or stream name, named after its kind.
        path = {name: valid_name(name, str(value)) for name, value in values.items()}
        return await handler(path, body)

    call.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    api.add_api_route(
        endpoint.path,
        call,
        methods=[endpoint.method],
        name=endpoint.name,
        response_model=endpoint.response,
        responses=_ERRORS,
        dependencies=list(dependencies),
    )

"""The heartbeat route, answered without the web framework's request machinery.

Every member calls it once per heartbeat interval, so at 1,000 members it is about all
the traffic a replica serves; FastAPI's routing, dependency solving and response
re-validation cost about as much CPU as answering the heartbeat itself (profile of
2026-12-01: ~25 % of a replica's samples). This ASGI middleware takes
``POST /v1/groups/{group}/heartbeat`` before the framework does and answers it with the
same checks in the same order of importance — the member token first (an
unauthenticated caller learns nothing else), then the group name, the body (at most
``MAX_BODY`` bytes, validated by the same pydantic model), then the service — and the
same answers: the response model as JSON, or ``{"error", "message", "retryable"}``.
Every other request goes on to the framework (which still declares the route, so the
OpenAPI document lists it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from streamworks.exceptions import CoordinatorError
from streamworks.protocol.control import ErrorCode, HeartbeatRequest
from streamworks.protocol.shards import NAME_PATTERN

if TYPE_CHECKING:
    from streamworks.coordinator.service import CoordinatorService

__all__ = ("HeartbeatRoute",)

log = logging.getLogger("streamworks.coordinator")

_PATH = re.compile(r"/v1/groups/([^/]+)/heartbeat")

_JSON_HEADERS = [(b"content-type", b"application/json")]


class HeartbeatRoute:
    """ASGI middleware answering the heartbeat route itself."""

    def __init__(
        self,
        app: Any,
        *,
        service: CoordinatorService,
        authorize: Callable[[str], None],
        max_body: int,
    ) -> None:
        """
        Args:
            app: the rest of the application.
            service: the replica.
            authorize: checks an ``Authorization`` header value (raises the 401).
            max_body: the largest body accepted (413 beyond).
        """
        self.app = app
        self.service = service
        self.authorize = authorize
        self.max_body = max_body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        match = None
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _PATH.fullmatch(scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        status, payload = await self._answer(scope, receive, match.group(1))
        headers = [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _answer(self, scope: Any, receive: Any, group: str) -> tuple[int, bytes]:
        try:
            self.authorize(_header(scope, b"authorization"))
            if not NAME_PATTERN.fullmatch(group):
                raise CoordinatorError(
                    "INVALID_REQUEST", f"invalid group name {group[:100]!r}", status=400
                )
            body = await self._body(receive)
            if not _is_json(_header(scope, b"content-type")):
                # As the framework decides: no content type, or a JSON one; a form, a
                # file upload or text is not a heartbeat whatever it contains.
                return 422, _error(
                    ErrorCode.INVALID_REQUEST, "body: the request body must be JSON", False
                )
            try:
                request = HeartbeatRequest.model_validate_json(body)
            except ValidationError as e:
                return 422, _error(ErrorCode.INVALID_REQUEST, _problems(e), False)
            response = await self.service.heartbeat(group, request)
            return 200, response.model_dump_json(by_alias=True).encode()
        except CoordinatorError as e:
            return e.status or 500, _error(e.code, e.message, e.retryable)
        except StarletteHTTPException as e:  # the body limit, counted as it arrived
            return e.status_code, _error(ErrorCode.INVALID_REQUEST, str(e.detail), False)
        except (RedisConnectionError, RedisTimeoutError) as e:
            # Redis restarting, loading its dataset, or cut off: an outage to retry.
            self.service.metrics.unavailable.inc()
            log.warning("request refused: Redis unavailable (%s)", type(e).__name__)
            message = f"Redis unavailable ({type(e).__name__}); retry"
            return 503, _error(ErrorCode.METADATA_UNAVAILABLE, message, True)
        except Exception as e:
            self.service.log_unexpected(e)
            message = "internal error (see the coordinator's log)"
            return 500, _error(ErrorCode.INTERNAL, message, True)

    async def _body(self, receive: Any) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise CoordinatorError("INVALID_REQUEST", "client disconnected", status=400)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise CoordinatorError(
                    "INVALID_REQUEST", f"request body larger than {self.max_body} bytes", status=413
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _header(scope: Any, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return ""


def _is_json(content_type: str) -> bool:
    """Whether a ``Content-Type`` value announces JSON (or is absent), as FastAPI's
    body parsing has it: ``application/json`` or ``application/<anything>+json``."""
    if not content_type:
        return True
    kind = content_type.split(";", 1)[0].strip().lower()
    main, _, sub = kind.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def _problems(error: ValidationError) -> str:
    """The same summary as the framework's: ``body.<field>: <message>``, at most 5."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in ('body', *e.get('loc', ())))}: {e.get('msg')}"
        for e in error.errors()[:5]
    )
    return problems[:1000]


def _error(code: ErrorCode | str, message: str, retryable: bool) -> bytes:
    return orjson.dumps({"error": str(code), "message": message, "retryable": retryable})

"""Schema-driven fuzzing of a live coordinator's HTTP API with schemathesis.

A ``TestRuntime`` with ``http=True`` (the production ``CoordinatorService`` behind
uvicorn, tokens configured, one real worker in its group) runs in a background event
loop; schemathesis reads its ``/openapi.json`` and sends, for every operation, requests
that fit the schema and requests that do not, with the member or admin token the
operation needs. Every answer must be: no 5xx; a status code and content type the
schema documents; a body that validates against the documented schema; every error
exactly ``{"error", "message", "retryable"}``; no schema-violating request accepted.

Bounded: ``MAX_EXAMPLES`` per operation and mode, derandomized (the same requests on
every run), no shrinking; the whole run takes well under a minute.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import anyio.from_thread
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from pydantic import SecretStr
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from streamworks import App
from streamworks.protocol.control import ErrorCode
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings

MEMBER_TOKEN = "fuzz-member-5c1e0a9d"
ADMIN_TOKEN = "fuzz-admin-7b3f2e6a"
MEMBER = {"Authorization": f"Bearer {MEMBER_TOKEN}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
#: Topology changes (and everything under /v1/admin/) need the admin token.
ADMIN_OPERATIONS = {("POST", "/v1/streams"), ("POST", "/v1/streams/{stream}/scale")}
MAX_EXAMPLES = 30
CODES = {code.value for code in ErrorCode}


@contextlib.contextmanager
def live_coordinator(redis_url: str) -> Iterator[TestRuntime]:
    """A runtime served over HTTP, running in a background event loop thread."""
    app = App("fuzzed")
    app.stream("orders", shards=2)
    app.stream("target", shards=1)  # no handler: scaled by the fuzzer, read by nobody

    @app.handler("orders")
    async def handle(value: Any) -> None: ...

    runtime = TestRuntime(
        app,
        http=True,
        redis_url=redis_url,
        settings=fast_settings(token=SecretStr(MEMBER_TOKEN), admin_token=SecretStr(ADMIN_TOKEN)),
    )
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(runtime) as rt,
    ):
        yield rt


def _error_shape(response: Any) -> str | None:
    """What is wrong with an error answer, or None."""
    if response.status_code < 400:
        return None
    content_type = response.headers.get("content-type") or [""]  # schemathesis: lists
    if isinstance(content_type, list):
        content_type = content_type[0]
    if not content_type.startswith("application/json"):
        return f"content type {content_type!r}"
    body = json.loads(response.content)
    if not isinstance(body, dict) or set(body) != {"error", "message", "retryable"}:
        return f"error body {body!r}"
    if body["error"] not in CODES or not isinstance(body["retryable"], bool):
        return f"error body {body!r}"
    if not isinstance(body["message"], str) or not body["message"]:
        return f"error body {body!r}"
    return None


def _fuzz(
    operation: Any,
    mode: GenerationMode,
    base_url: str,
    path: dict[str, str] | None = None,
    max_examples: int = MAX_EXAMPLES,
) -> list[str]:
    """Run one operation in one mode (with ``path`` parameters fixed, when given); the
    problems found (one per distinct kind)."""
    admin = operation.path.startswith("/v1/admin/")
    admin |= (operation.method.upper(), operation.path) in ADMIN_OPERATIONS
    headers = ADMIN if admin else MEMBER
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    if mode is GenerationMode.NEGATIVE:
        checks.append(negative_data_rejection)
    problems: dict[str, str] = {}

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path))
    def run(case: Any) -> None:
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        label = f"{operation.method.upper()} {operation.path} [{mode.value}] {path or ''}"
        try:
            case.validate_response(response, checks=checks, headers=headers)
        except (Exception, BaseExceptionGroup) as e:  # schemathesis: FailureGroup
            problems.setdefault(f"{label}: {type(e).__name__}", f"{e}"[:1500])
        if operation.path.startswith("/v1/") or response.status_code >= 500:
            shape = _error_shape(response)
            if shape is not None:
                problems.setdefault(f"{label}: error shape", f"{response.status_code} {shape}")

    try:
        run()
    except Unsatisfiable:
        # No parameter and no body: nothing to negate (GET /livez, /v1/status, ...).
        assert mode is GenerationMode.NEGATIVE, operation.path
    return [f"{k}\n{v}" for k, v in problems.items()]


@pytest.mark.timeout(300)
def test_the_coordinator_api_survives_schema_driven_fuzzing(streamworks_redis_url: str) -> None:
    with live_coordinator(streamworks_redis_url) as rt:
        assert rt.http_url is not None
        schema = schemathesis.openapi.from_url(f"{rt.http_url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        # Reading first, topology changes last (they grow what later requests read).
        operations.sort(key=lambda op: (op.method.upper() != "GET", op.path))
        assert len(operations) >= 14  # the 11 of v1 (and any added since), health, metrics
        problems: list[str] = []
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                problems += _fuzz(operation, mode, rt.http_url)
                # Path parameters are free strings in the schema, so most generated
                # ones are invalid names; fuzz the bodies against real ones too.
                if "{" in operation.path:
                    path = {"group": "fuzzed"} if "{group}" in operation.path else {}
                    if "{stream}" in operation.path:
                        path["stream"] = "target" if "scale" in operation.path else "orders"
                    # A real migration per accepted scale (up to 4096 shards): a few.
                    n = 5 if "scale" in operation.path else MAX_EXAMPLES
                    problems += _fuzz(operation, mode, rt.http_url, path, n)
        # Still ready, and a member's heartbeat is still answered properly.
        with httpx.Client(base_url=rt.http_url, timeout=10) as http:
            assert http.get("/readyz").status_code == 200
            beat = {"memberId": "after-fuzz", "memberEpoch": 0, "subscriptions": ["orders"]}
            response = http.post("/v1/groups/fuzzed/heartbeat", json=beat, headers=MEMBER)
            assert response.status_code == 200 and response.json()["status"] == "OK"
        assert problems == [], "\n\n".join(problems)

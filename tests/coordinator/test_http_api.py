"""The coordinator's HTTP API (v1) over real HTTP: authentication, error shape, hostile
bodies, discovery, health and metrics (docs/protocol.md#http-api,
docs/security.md)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from streamworks.coordinator.service import CoordinatorService
from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.control import (
    MAX_SHARDS_PER_MEMBER,
    MAX_SUBSCRIPTIONS,
    HeartbeatStatus,
)
from streamworks.settings import Settings
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import beat, open_service, serve_api

MEMBER_TOKEN = "member-6f1c2b9e0d4a7358"
ADMIN_TOKEN = "admin-93ab47e1c0d25f68"
MEMBER = {"authorization": f"Bearer {MEMBER_TOKEN}"}
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
JOIN = {"memberId": "m1", "memberEpoch": 0, "subscriptions": ["orders"]}

#: Every v1 endpoint: (method, path, a valid body, needs the admin token).
ENDPOINTS: list[tuple[str, str, Any, bool]] = [
    ("POST", "/v1/streams/ensure", {"name": "orders", "shards": 2}, False),
    ("POST", "/v1/groups/g/heartbeat", JOIN, False),
    ("GET", "/v1/streams/orders/routing", None, False),
    ("GET", "/v1/streams", None, False),
    ("GET", "/v1/streams/orders", None, False),
    ("GET", "/v1/groups", None, False),
    ("GET", "/v1/groups/g", None, False),
    ("GET", "/v1/status", None, False),
    ("POST", "/v1/streams", {"name": "audit", "shards": 1}, True),
    ("POST", "/v1/streams/orders/scale", {"shards": 3}, True),
    ("POST", "/v1/admin/reinitialize", {"kind": "group", "name": "g", "confirm": True}, True),
    (
        "POST",
        "/v1/admin/unsubscribe",
        {"group": "nobody", "stream": "orders", "confirm": True},
        True,
    ),
]


def secured(settings: Settings) -> Settings:
    return fast_settings(
        settings, token=SecretStr(MEMBER_TOKEN), admin_token=SecretStr(ADMIN_TOKEN)
    )


@contextlib.asynccontextmanager
async def open_api(
    settings: Settings, *, log_level: str = "warning"
) -> AsyncIterator[tuple[CoordinatorService, httpx.AsyncClient]]:
    """A coordinator replica served over real HTTP, and an HTTP client for it."""
    async with (
        open_service(settings) as service,
        serve_api(service, log_level=log_level) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as http,
    ):
        yield service, http


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The documented error shape, exactly: ``{"error", "message", "retryable"}``."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error", "message", "retryable"}, body
    assert body["error"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    assert isinstance(body["retryable"], bool)
    return dict(body)


async def send(
    http: httpx.AsyncClient,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    *,
    raw: bytes | None = None,
) -> httpx.Response:
    content = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    return await http.request(
        method,
        path,
        content=content,
        headers={"content-type": "application/json", **(headers or {})},
    )


async def test_every_endpoint_refuses_a_missing_or_wrong_bearer_token(settings: Settings) -> None:
    async with open_api(secured(settings)) as (service, http):
        wrong = [
            {},
            {"authorization": "Bearer wrong"},
            {"authorization": f"Bearer {MEMBER_TOKEN}x"},
            {"authorization": f"Bearer {MEMBER_TOKEN[:-1]}"},
            {"authorization": f"Basic {MEMBER_TOKEN}"},
            {"authorization": MEMBER_TOKEN},
            {"authorization": "Bearer"},
        ]
        for method, path, body, admin in ENDPOINTS:
            refused = [*wrong, MEMBER] if admin else [*wrong, ADMIN]
            for headers in refused:
                response = await send(http, method, path, body, headers)
                error = assert_error(response, 401, "UNAUTHORIZED")
                assert error["retryable"] is False, (method, path)
            if method == "POST":
                # An unparsable body does not get past the token check either.
                response = await send(http, method, path, raw=b"{not json")
                assert_error(response, 401, "UNAUTHORIZED")
        # Refused requests changed nothing.
        assert await service.store.registered_streams() == []
        assert await service.store.registered_groups() == []

        # With the right token each endpoint does its job.
        answers = {}
        for method, path, body, admin in ENDPOINTS:
            response = await send(http, method, path, body, ADMIN if admin else MEMBER)
            answers[(method, path)] = response
        assert all(
            r.status_code == 200
            for (_, path), r in answers.items()
            if not path.startswith("/v1/admin/")
        ), {k: (r.status_code, r.text) for k, r in answers.items()}
        heartbeat = answers[("POST", "/v1/groups/g/heartbeat")].json()
        assert heartbeat["status"] == "OK" and heartbeat["memberEpoch"] > 0
        assert answers[("POST", "/v1/streams/orders/scale")].json()["shardCount"] == 3
        # The operator's re-initialisation passed authentication, refused on its merits.
        assert_error(answers[("POST", "/v1/admin/reinitialize")], 409, "ALREADY_EXISTS")
        assert_error(answers[("POST", "/v1/admin/unsubscribe")], 404, "NOT_FOUND")
        assert await service.store.registered_streams() == ["audit", "orders"]


async def test_without_a_configured_token_requests_need_none(settings: Settings) -> None:
    async with open_api(fast_settings(settings)) as (_, http):
        response = await send(http, "POST", "/v1/streams/ensure", {"name": "orders", "shards": 1})
        assert response.status_code == 200
        response = await send(http, "POST", "/v1/streams", {"name": "audit", "shards": 1})
        assert response.status_code == 200


async def test_tokens_never_appear_in_responses_or_log_records(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    near_misses = [f"{MEMBER_TOKEN}0", f"{ADMIN_TOKEN}0", MEMBER_TOKEN[:-1]]
    bodies: list[str] = []
    async with open_api(secured(settings), log_level="debug") as (_, http):
        for method, path, body, admin in ENDPOINTS:
            for headers in (
                ADMIN if admin else MEMBER,
                MEMBER if admin else ADMIN,
                *({"authorization": f"Bearer {t}"} for t in near_misses),
                {"authorization": f"Basic {MEMBER_TOKEN}"},
            ):
                response = await send(http, method, path, body, headers)
                bodies.append(response.text)
            bodies.append((await send(http, method, path, {"junk": MEMBER_TOKEN}, MEMBER)).text)
        for path in ("/livez", "/readyz", "/metrics", "/openapi.json"):
            response = await http.get(path, headers=ADMIN)
            bodies.append(response.text)
    logged = [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    # The capture works: uvicorn's access log and the coordinator's records are in it.
    assert any("/v1/groups/g/heartbeat" in text for text in logged)
    assert any(r.name.startswith("streamworks") for r in caplog.records)
    for secret in (MEMBER_TOKEN, ADMIN_TOKEN, *near_misses):
        leaks = [t for t in bodies + logged if secret in t]
        assert leaks == [], (secret, leaks[:3])


TOO_MANY_SHARDS = ["orders/0@0"] * (MAX_SHARDS_PER_MEMBER + 1)
HOSTILE_HEARTBEATS: list[tuple[str, Any]] = [
    ("too many owned shards", {**JOIN, "memberEpoch": 1, "ownedShards": TOO_MANY_SHARDS}),
    ("too many revoking shards", {**JOIN, "memberEpoch": 1, "revokingShards": TOO_MANY_SHARDS}),
    ("too many fenced shards", {**JOIN, "memberEpoch": 1, "fencedShards": TOO_MANY_SHARDS}),
    (
        "too many subscriptions",
        {**JOIN, "subscriptions": [f"s{i}" for i in range(MAX_SUBSCRIPTIONS + 1)]},
    ),
    ("too many client fields", {**JOIN, "client": {f"k{i}": "v" for i in range(17)}}),
    ("long client value", {**JOIN, "client": {"host": "h" * 201}}),
    ("epoch below -1", {**JOIN, "memberEpoch": -2}),
    ("epoch too large", {**JOIN, "memberEpoch": 2**53 + 1}),
    ("huge epoch", {**JOIN, "memberEpoch": 10**100}),
    ("negative metadata version", {**JOIN, "metadataVersion": -1}),
    ("rebalance timeout 0", {**JOIN, "rebalanceTimeoutMs": 0}),
    ("empty member id", {**JOIN, "memberId": ""}),
    ("member id with a space", {**JOIN, "memberId": "a b"}),
    ("member id too long", {**JOIN, "memberId": "m" * 65}),
    ("stream name with a space", {**JOIN, "subscriptions": ["bad name"]}),
    ("stream name with a path", {**JOIN, "subscriptions": ["../etc"]}),
    ("stream name too long", {**JOIN, "subscriptions": ["s" * 101]}),
    ("empty stream name", {**JOIN, "subscriptions": [""]}),
    ("shard id without index", {**JOIN, "memberEpoch": 1, "ownedShards": ["orders"]}),
    ("shard id with a bad incarnation", {**JOIN, "memberEpoch": 1, "ownedShards": ["orders/1@x"]}),
    ("unknown field", {**JOIN, "evil": True}),
    ("snake_case alias smuggling", {**JOIN, "member_epoch": 5}),
    ("epoch as text", {**JOIN, "memberEpoch": "abc"}),
    ("epoch as float", {**JOIN, "memberEpoch": 1.5}),
    ("epoch null", {**JOIN, "memberEpoch": None}),
    ("subscriptions as a string", {**JOIN, "subscriptions": "orders"}),
    ("owned shards as an object", {**JOIN, "memberEpoch": 1, "ownedShards": {"orders/0@0": 1}}),
    ("member id missing", {"memberEpoch": 0, "subscriptions": ["orders"]}),
    ("body is a list", [JOIN]),
    ("body is a string", "join"),
    ("body is null", None),
]

HOSTILE_RAW = [b"{not json", b"\xff\xfe\x00", b"", b'{"memberId": "m1",', b"[" * 100_000]


async def test_hostile_bodies_get_invalid_request(settings: Settings) -> None:
    async with open_api(secured(settings)) as (service, http):
        await send(http, "POST", "/v1/streams/ensure", {"name": "orders", "shards": 2}, MEMBER)
        for label, body in HOSTILE_HEARTBEATS:
            raw = b"null" if body is None else None
            response = await send(http, "POST", "/v1/groups/g/heartbeat", body, MEMBER, raw=raw)
            error = assert_error(response, 422, "INVALID_REQUEST")
            assert error["retryable"] is False, label
            assert len(error["message"]) <= 1000, label
        for raw in HOSTILE_RAW:
            response = await send(http, "POST", "/v1/groups/g/heartbeat", raw=raw, headers=MEMBER)
            assert response.status_code in (400, 422), (raw[:20], response.text)
            assert_error(response, response.status_code, "INVALID_REQUEST")
        for body in (
            {"name": "bad/name", "shards": 1},
            {"name": "audit", "shards": -1},
            {"name": "audit", "shards": 4097},
            {"name": "audit", "shards": "two"},
            {"name": "audit", "shards": 1, "replicas": 3},
            {"shards": 1},
        ):
            response = await send(http, "POST", "/v1/streams", body, ADMIN)
            assert_error(response, 422, "INVALID_REQUEST")
        for body in (
            {"kind": "group", "name": "g", "confirm": False},
            {"kind": "group", "name": "g"},
            {"kind": "everything", "name": "g", "confirm": True},
            {"kind": "stream", "name": "orders", "shards": -3, "confirm": True},
        ):
            response = await send(http, "POST", "/v1/admin/reinitialize", body, ADMIN)
            assert_error(response, 422, "INVALID_REQUEST")
        # Names in paths are checked too.
        for bad in ("bad%20name", "-leading-dash", "n" * 101):
            for method, path, body in (
                ("POST", f"/v1/groups/{bad}/heartbeat", JOIN),
                ("GET", f"/v1/groups/{bad}", None),
                ("GET", f"/v1/streams/{bad}", None),
                ("GET", f"/v1/streams/{bad}/routing", None),
            ):
                response = await send(http, method, path, body, MEMBER)
                assert response.status_code in (400, 422), (path, response.text)
                assert_error(response, response.status_code, "INVALID_REQUEST")
        # Well-formed but breaking the protocol: a join that claims to own shards.
        response = await send(
            http,
            "POST",
            "/v1/groups/g/heartbeat",
            {**JOIN, "ownedShards": ["orders/0@0"]},
            MEMBER,
        )
        assert_error(response, 400, "INVALID_REQUEST")
        # None of it reached the metadata.
        assert await service.store.registered_groups() == []
        assert await service.store.registered_streams() == ["orders"]
        # And the API still serves a valid request.
        response = await send(http, "POST", "/v1/groups/g/heartbeat", JOIN, MEMBER)
        assert response.status_code == 200 and response.json()["status"] == "OK"


async def test_unknown_streams_groups_and_paths_are_not_found(settings: Settings) -> None:
    async with open_api(secured(settings)) as (_, http):
        for path in (
            "/v1/streams/nope/routing",
            "/v1/streams/nope",
            "/v1/groups/nope",
        ):
            error = assert_error(await send(http, "GET", path, headers=MEMBER), 404, "NOT_FOUND")
            assert error["retryable"] is False
            assert "nope" in error["message"]
        assert_error(await send(http, "GET", "/v1/nothing-here", headers=MEMBER), 404, "NOT_FOUND")


async def test_openapi_lists_every_v1_endpoint_with_its_errors(settings: Settings) -> None:
    async with open_api(secured(settings)) as (_, http):
        response = await http.get("/openapi.json")
        assert response.status_code == 200
        doc = response.json()
    listed = {
        (method.upper(), path)
        for path, operations in doc["paths"].items()
        for method in operations
        if path.startswith("/v1/")
    }
    expected = {
        ("POST", "/v1/groups/{group}/heartbeat"),
        ("GET", "/v1/streams/{stream}/routing"),
        ("POST", "/v1/streams/ensure"),
        ("POST", "/v1/streams"),
        ("POST", "/v1/streams/{stream}/scale"),
        ("POST", "/v1/admin/reinitialize"),
        ("POST", "/v1/admin/unsubscribe"),
        ("GET", "/v1/streams"),
        ("GET", "/v1/streams/{stream}"),
        ("GET", "/v1/groups"),
        ("GET", "/v1/groups/{group}"),
        ("GET", "/v1/status"),
    }
    assert len(expected) == len(ENDPOINTS)
    assert listed == expected
    for path, operations in doc["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            assert "401" in operation["responses"], (method, path)
            schema = operation["responses"]["401"]["content"]["application/json"]["schema"]
            assert schema["$ref"].endswith("/ApiError"), (method, path)
    assert {"/livez", "/readyz", "/metrics"} <= set(doc["paths"])


@pytest.mark.seed("E4")
async def test_health_metrics_and_terminating_over_http(settings: Settings) -> None:
    async with open_api(secured(settings)) as (service, http):
        # Health and metrics need no token.
        livez = await http.get("/livez")
        assert (livez.status_code, livez.text) == (200, "ok")
        readyz = await http.get("/readyz")
        assert (readyz.status_code, readyz.text) == (200, "ok")
        await send(http, "POST", "/v1/streams/ensure", {"name": "orders", "shards": 1}, MEMBER)
        joined = await send(http, "POST", "/v1/groups/g/heartbeat", JOIN, MEMBER)
        assert joined.json()["status"] == "OK"
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert 'streamworks_coordinator_heartbeats_total{path="full",status="OK"} 1.0' in (
            metrics.text
        )
        assert "streamworks_coordinator_heartbeat_seconds_bucket" in metrics.text
        assert 'streamworks_coordinator_live_members{group="g"} 1.0' in metrics.text

        await service.terminate()
        readyz = await http.get("/readyz")
        error = assert_error(readyz, 503, "COORDINATOR_TERMINATING")
        assert error["retryable"] is True
        assert (await http.get("/livez")).status_code == 200  # alive, just not ready
        epoch = joined.json()["memberEpoch"]
        again = await send(
            http, "POST", "/v1/groups/g/heartbeat", {**JOIN, "memberId": "m2"}, MEMBER
        )
        error = assert_error(again, 503, "COORDINATOR_TERMINATING")
        assert error["retryable"] is True
        # A known member's heartbeat that changes nothing is refused too: a replica
        # that is going away answers nothing new.
        renew = await send(
            http,
            "POST",
            "/v1/groups/g/heartbeat",
            {**JOIN, "memberEpoch": epoch, "ownedShards": ["orders/0@0"]},
            MEMBER,
        )
        assert_error(renew, 503, "COORDINATOR_TERMINATING")


async def test_readyz_fails_while_redis_does_not_answer(settings: Settings) -> None:
    unreachable = settings.with_overrides(redis_url="redis://127.0.0.1:1/0")
    async with open_api(unreachable) as (_, http):
        assert (await http.get("/livez")).status_code == 200
        error = assert_error(await http.get("/readyz"), 503, "METADATA_UNAVAILABLE")
        assert error["retryable"] is True


async def test_requests_while_redis_is_down_get_a_retryable_503_not_a_crash(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis unreachable (restarting, loading its AOF, a cut) is an outage to retry,
    answered 503 METADATA_UNAVAILABLE with retryable true and logged as one line:
    not a 500 with a traceback for every request."""
    unreachable = settings.with_overrides(redis_url="redis://127.0.0.1:1/0")
    caplog.set_level(logging.INFO)
    async with open_api(unreachable) as (_, http):
        for method, path, body in (
            ("POST", "/v1/groups/g/heartbeat", JOIN),
            ("GET", "/v1/streams/orders/routing", None),
            ("GET", "/v1/status", None),
        ):
            response = await http.request(method, path, json=body, headers=MEMBER)
            error = assert_error(response, 503, "METADATA_UNAVAILABLE")
            assert error["retryable"] is True
            assert "Redis" in error["message"]
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


@pytest.mark.seed("E4")
async def test_clients_move_on_from_a_terminating_replica(settings: Settings) -> None:
    configured = secured(settings)
    async with (
        open_api(configured) as (leaving, leaving_http),
        open_service(configured, replica="b") as staying,
        serve_api(staying) as staying_url,
    ):
        await staying.ensure_stream("orders", 1)
        await leaving.terminate()
        client = CoordinatorClient(
            [str(leaving_http.base_url), staying_url],
            token=MEMBER_TOKEN,
            admin_token=ADMIN_TOKEN,
        )
        async with client:
            response = await client.heartbeat("g", beat("m1", 0, subscriptions=["orders"]))
            assert response.status is HeartbeatStatus.OK
            assert response.assigned and response.member_epoch > 0
        info = await staying.group_info("g")
        assert [m.member_id for m in info.members] == ["m1"]

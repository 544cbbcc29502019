"""The heartbeat's ASGI fast path (``coordinator/http_heartbeat.py``) against the route
the framework declares for it (``create_api``): two replicas over real HTTP, one with
the fast path in front and one without, each on a namespace of its own, get the same
requests — a member's life (join, heartbeats, a stale re-send, a wrong epoch, an
unknown member, a leave) and every kind of bad request (token, group name, body,
content type, size) — and must answer each the same: status, content type, and body
(but for the fence tokens and the namespace, which differ between namespaces by
design). The error *message* for a body that is not a JSON object is the one part
that differs: each side quotes its own JSON parser (the code, status and
``retryable`` are the same)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from pydantic import SecretStr

from streamworks.coordinator.http import MAX_BODY
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import Settings
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import open_service, serve_api

TOKEN = "member-2b7e151628aed2a6"
AUTH = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


@contextlib.asynccontextmanager
async def _replica(settings: Settings, *, fast: bool) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        open_service(settings) as service,
        serve_api(service, heartbeat_route=fast) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as http,
    ):
        await service.create_stream("orders", 4)
        yield http


def _normal(response: httpx.Response) -> tuple[int, str, Any]:
    """What must be equal: the status, the content type, the body without what differs
    between two namespaces (the namespace id, the key prefix, the fence tokens)."""
    try:
        body = response.json()
    except ValueError:
        body = response.text
    if isinstance(body, dict):
        body.pop("namespaceId", None)
        body.pop("keyPrefix", None)
        for grant in body.get("assigned", ()):
            assert isinstance(grant.pop("epoch"), int)
    return response.status_code, response.headers.get("content-type", ""), body


def _raw(body: Any) -> bytes:
    return json.dumps(body).encode()


async def test_the_fast_path_answers_every_request_as_the_declared_route(
    settings: Settings, redis: Any
) -> None:
    base = fast_settings(settings, token=SecretStr(TOKEN))
    other = base.model_copy(update={"key_prefix": f"{settings.key_prefix}x"})
    path = "/v1/groups/g/heartbeat"
    join = {"memberId": "m1", "memberEpoch": 0, "subscriptions": ["orders"], "sequence": 1}
    bad: list[tuple[str, str, dict[str, str], bytes]] = [
        ("POST", path, {"content-type": "application/json"}, _raw(join)),  # no token
        ("POST", path, {**AUTH, "authorization": "Bearer wrong"}, _raw(join)),
        ("POST", path, {"authorization": TOKEN}, b"{not json"),  # no scheme, bad body
        ("POST", "/v1/groups/bad!name/heartbeat", AUTH, _raw(join)),
        ("POST", "/v1/groups/" + "g" * 300 + "/heartbeat", AUTH, _raw(join)),
        ("POST", path, AUTH, b"{not json"),
        ("POST", path, AUTH, b""),
        ("POST", path, AUTH, b"[]"),
        ("POST", path, AUTH, _raw({**join, "memberEpoch": "x"})),
        ("POST", path, AUTH, _raw({**join, "memberEpoch": -2})),
        ("POST", path, AUTH, _raw({**join, "bogus": 1})),
        ("POST", path, AUTH, _raw({**join, "memberId": "no spaces allowed"})),
        ("POST", path, AUTH, _raw({**join, "subscriptionStarts": {"other": "latest"}})),
        ("POST", path, {**AUTH, "content-type": "text/plain"}, _raw(join)),
        ("POST", path, AUTH, b" " * (MAX_BODY + 1)),
        ("GET", path, AUTH, b""),
    ]
    #: Refused alike (422 INVALID_REQUEST), but worded by different JSON parsers.
    unparsed = [
        ("POST", path, AUTH, b"{not json"),
        ("POST", path, AUTH, b""),
        ("POST", path, AUTH, b"[]"),
        ("POST", path, {**AUTH, "content-type": "text/plain"}, _raw(join)),
    ]
    compared = 0
    try:
        async with _replica(base, fast=True) as fast, _replica(other, fast=False) as declared:

            async def both(method: str, url: str, headers: dict[str, str], body: bytes) -> Any:
                nonlocal compared
                a = await fast.request(method, url, headers=headers, content=body)
                b = await declared.request(method, url, headers=headers, content=body)
                left, right = _normal(a), _normal(b)
                if (method, url, headers, body) in unparsed:
                    # The one difference: a body that is not a JSON object is refused
                    # alike, with the JSON parser's own words on each side.
                    for side in (left, right):
                        assert side[2]["message"].startswith("body"), side
                        side[2].pop("message")
                assert left == right, (method, url, body[:200])
                compared += 1
                return a

            for request in bad:
                response = await both(*request)
                assert response.status_code >= 400, request[:2]

            async def beat(body: dict[str, Any]) -> dict[str, Any]:
                response = await both("POST", path, AUTH, _raw(body))
                return dict(response.json())

            joined = await beat(join)
            assert joined["status"] == "OK" and joined["memberEpoch"] > 0
            epoch = joined["memberEpoch"]
            owned = [g["shard"] for g in joined["assigned"]]
            steady = {**join, "memberEpoch": epoch, "ownedShards": owned, "sequence": 2}
            assert (await beat(steady))["status"] == "OK"
            stale = await beat(steady)  # the same number again: acts on nothing
            assert stale["error"] == "STALE_REQUEST"
            m2 = await beat({"memberId": "m2", "memberEpoch": 0, "subscriptions": ["orders"]})
            assert m2["status"] == "OK"
            again = await beat({**steady, "sequence": 3})
            assert again["status"] == "OK"
            fenced = await beat({**steady, "memberEpoch": epoch + 100, "sequence": 4})
            assert fenced["status"] == "FENCED"
            unknown = await beat({"memberId": "m9", "memberEpoch": 3, "sequence": 1})
            assert unknown["status"] == "UNKNOWN_MEMBER"
            left = await beat({"memberId": "m2", "memberEpoch": -1})
            assert left["memberEpoch"] == -1
    finally:
        for pattern in Keyspace(other.key_prefix).namespace_patterns():
            keys = [k async for k in redis.scan_iter(match=pattern, count=1000)]
            if keys:
                await redis.delete(*keys)
    assert compared == len(bad) + 8

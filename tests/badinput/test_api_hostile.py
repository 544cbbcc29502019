"""Hand-written hostile requests to a live coordinator (``TestRuntime(http=True)``, tokens
set, a real worker in its group), beyond ``tests/coordinator/test_http_api.py``:
deeply nested JSON, huge strings in every field, out-of-range and int64-overflowing
numbers, unicode and path traversal in path parameters, wrong content types, empty
bodies, duplicate keys, very long URLs and headers, thousands of concurrent bad
requests. Every answer is a 4xx ``{"error", "message", "retryable"}`` (never a 5xx),
nothing invalid reaches the metadata, and afterwards the coordinator is ready, answers
a valid heartbeat, and the worker still consumes.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from pydantic import SecretStr

from streamworks import App
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.badinput.support import REPO, child_env

MEMBER_TOKEN = "hostile-member-0e4b9c71"
ADMIN_TOKEN = "hostile-admin-a83d5f20"
MEMBER = {"authorization": f"Bearer {MEMBER_TOKEN}"}
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
JSON = {"content-type": "application/json"}
#: Requests join group "hostile" on stream "other": both exist apart from the app's
#: group and handled stream, so whatever a request does cannot hold up its consumers.
JOIN = {"memberId": "h1", "memberEpoch": 0, "subscriptions": ["other"]}

#: Every POST endpoint: (path, a valid body, its headers).
POSTS: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("/v1/groups/hostile/heartbeat", JOIN, MEMBER),
    ("/v1/streams/ensure", {"name": "orders", "shards": 2}, MEMBER),
    ("/v1/streams", {"name": "audit", "shards": 1}, ADMIN),
    ("/v1/streams/orders/scale", {"shards": 2}, ADMIN),
    ("/v1/admin/reinitialize", {"kind": "group", "name": "hostile", "confirm": True}, ADMIN),
    ("/v1/admin/unsubscribe", {"group": "hostile", "stream": "other", "confirm": True}, ADMIN),
]


@contextlib.asynccontextmanager
async def live(redis_url: str) -> AsyncIterator[tuple[TestRuntime, httpx.AsyncClient, list[str]]]:
    """A runtime served over HTTP, a client for it, and the list its handler fills."""
    app = App("hostile-app")
    app.stream("orders", shards=2)
    app.stream("other", shards=2)  # subscribed to by the hostile requests' members
    handled: list[str] = []

    @app.handler("orders")
    async def handle(value: dict[str, str]) -> None:
        handled.append(value["id"])

    settings = fast_settings(token=SecretStr(MEMBER_TOKEN), admin_token=SecretStr(ADMIN_TOKEN))
    async with TestRuntime(app, http=True, redis_url=redis_url, settings=settings) as rt:
        assert rt.http_url is not None
        async with httpx.AsyncClient(base_url=rt.http_url, timeout=60) as http:
            yield rt, http, handled
            await _still_serving(rt, http, handled)


async def _still_serving(rt: TestRuntime, http: httpx.AsyncClient, handled: list[str]) -> None:
    """The coordinator is ready, answers a valid heartbeat, and the group consumes."""
    assert (await http.get("/readyz")).status_code == 200
    response = await http.post(
        "/v1/groups/probe/heartbeat",
        json={"memberId": "probe", "memberEpoch": 0, "subscriptions": ["other"]},
        headers=MEMBER,
    )
    assert response.status_code == 200 and response.json()["status"] == "OK", response.text
    await rt.app.publish("orders", {"id": "after"})
    await rt.wait_idle()
    assert "after" in handled
    assert await rt.dead_letters("orders") == []


def assert_error(response: httpx.Response, *statuses: int) -> dict[str, Any]:
    """A 4xx in the documented shape, exactly ``{"error", "message", "retryable"}``."""
    assert response.status_code in statuses, (response.status_code, response.text[:300])
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error", "message", "retryable"}, body
    assert isinstance(body["message"], str) and 0 < len(body["message"]) <= 1000, body
    assert body["retryable"] is False, body
    return dict(body)


async def _metadata(rt: TestRuntime) -> tuple[list[str], list[str]]:
    assert rt.service is not None
    store = rt.service.store
    return sorted(await store.registered_streams()), sorted(await store.registered_groups())


def _nest(depth: int, leaf: str = '"x"') -> str:
    return '{"a":' * depth + leaf + "}" * depth


async def test_deeply_nested_json(streamworks_redis_url: str) -> None:
    async with live(streamworks_redis_url) as (rt, http, _):
        before = await _metadata(rt)
        for path, body, headers in POSTS:
            first = next(iter(body))
            bodies = [
                "[" * 100_000 + "]" * 100_000,  # valid JSON, too deep for the parser
                _nest(100_000),
                json.dumps(body)[:-1] + f', "{first}": ' + _nest(100_000) + "}",
                json.dumps({**body, first: None})[:-1].replace("null", _nest(500)) + "}",
            ]
            for raw in bodies:
                response = await http.post(path, content=raw, headers={**headers, **JSON})
                assert_error(response, 400, 422)
        assert await _metadata(rt) == before


async def test_huge_strings_in_every_field(streamworks_redis_url: str) -> None:
    huge = "\u00e9" * (1 << 20)  # 2 MiB of UTF-8
    async with live(streamworks_redis_url) as (rt, http, _):
        before = await _metadata(rt)
        for path, body, headers in POSTS:
            variants: list[dict[str, Any]] = [{**body, name: huge} for name in body]
            variants.append({**body, huge: 1})  # a huge unknown field name
            if "heartbeat" in path:
                variants += [
                    {**body, "subscriptions": [huge]},
                    {**body, "memberEpoch": 1, "ownedShards": [f"orders/0@0{huge}"]},
                    {**body, "memberEpoch": 1, "revokingShards": [huge]},
                    {**body, "memberEpoch": 1, "fencedShards": [huge]},
                    {**body, "client": {huge: "v"}},
                    {**body, "client": {"k": huge}},
                ]
            for variant in variants:
                response = await http.post(path, json=variant, headers=headers)
                error = assert_error(response, 400, 422)
                assert huge[:1000] not in error["message"]  # never echoed back
        # A 64 MiB body is refused before it is read: by its Content-Length, or, sent
        # chunked without one, as soon as the bytes received pass the limit.
        body = {**JOIN, "memberId": "m" * (64 << 20)}
        response = await http.post(POSTS[0][0], json=body, headers=MEMBER)
        assert assert_error(response, 413)["error"] == "INVALID_REQUEST"
        raw = json.dumps(body).encode()

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(raw), 1 << 20):
                yield raw[i : i + (1 << 20)]

        response = await http.post(POSTS[0][0], content=chunks(), headers={**MEMBER, **JSON})
        assert assert_error(response, 413)["error"] == "INVALID_REQUEST"
        assert await _metadata(rt) == before


OUT_OF_RANGE: list[Any] = [
    -2,
    -(2**63),
    -(2**63) - 1,
    2**63 - 1,
    2**63,
    2**64,
    10**30,
    -(10**30),
    1e308,
    -1e308,
    1.5,
    "ten",
    None,
    [],
    {},
]
NON_FINITE = [b"NaN", b"Infinity", b"-Infinity", b"9" * 5000, b"1e999", b"-1e999"]


async def test_negative_and_int64_overflowing_numbers(streamworks_redis_url: str) -> None:
    async with live(streamworks_redis_url) as (rt, http, _):
        before = await _metadata(rt)
        heartbeat = "/v1/groups/hostile/heartbeat"
        for field in ("memberEpoch", "metadataVersion", "rebalanceTimeoutMs"):
            for value in OUT_OF_RANGE:
                if field == "rebalanceTimeoutMs" and value is None:
                    continue  # optional: null means "not given"
                response = await http.post(heartbeat, json={**JOIN, field: value}, headers=MEMBER)
                assert_error(response, 422)
            for raw in NON_FINITE:
                content = json.dumps(JOIN)[:-1].encode() + b', "' + field.encode() + b'": ' + raw
                response = await http.post(
                    heartbeat, content=content + b"}", headers={**MEMBER, **JSON}
                )
                assert_error(response, 400, 422)
        for path, body, headers in POSTS[1:]:
            if "shards" not in body and "reinitialize" not in path:
                continue
            for value in [-1, 4097, *OUT_OF_RANGE[1:10]]:
                response = await http.post(path, json={**body, "shards": value}, headers=headers)
                assert_error(response, 422)
        # In range for the schema, out of range for the protocol: still a clear 400.
        for change in ({"memberEpoch": 2**53}, {"metadataVersion": 2**53}):
            response = await http.post(heartbeat, json={**JOIN, **change}, headers=MEMBER)
            assert_error(response, 400)
        assert await _metadata(rt) == before
        # A leave (-1) of a member nobody knows is harmless.
        response = await http.post(heartbeat, json={**JOIN, "memberEpoch": -1}, headers=MEMBER)
        assert response.status_code == 200, response.text


@pytest.mark.parametrize("value", ["0", 0.0, False], ids=["string", "float", "boolean"])
async def test_integers_of_another_json_type_are_refused(
    value: Any, streamworks_redis_url: str
) -> None:
    async with live(streamworks_redis_url) as (_, http, _):
        response = await http.post(
            "/v1/groups/hostile/heartbeat", json={**JOIN, "memberEpoch": value}, headers=MEMBER
        )
        assert_error(response, 422)


PATH_NAMES = [
    "..",
    "%2e%2e",
    "..%2F..%2Fetc%2Fpasswd",
    "orders%00",
    "orders%00.json",
    "%F0%9F%98%80",  # an emoji
    "%EF%BD%8F%EF%BD%92%EF%BD%84%EF%BD%85%EF%BD%92%EF%BD%93",  # fullwidth "orders"
    "%E2%80%AEsredro",  # right-to-left override
    "or%CC%88ders",  # a combining diaeresis
    "%ff%fe",  # not UTF-8
    "%20orders",
    "orders%20",
    "orders%09",
    "-orders",
    ".orders",
    "o" * 101,
    "%25",
    "%C0%AE%C0%AE",  # overlong "..": not UTF-8
]


async def test_unicode_and_traversal_in_path_parameters(streamworks_redis_url: str) -> None:
    async with live(streamworks_redis_url) as (rt, http, _):
        before = await _metadata(rt)
        for name in PATH_NAMES:
            for method, path, body, headers in (
                ("GET", f"/v1/streams/{name}", None, MEMBER),
                ("GET", f"/v1/streams/{name}/routing", None, MEMBER),
                ("GET", f"/v1/groups/{name}", None, MEMBER),
                ("POST", f"/v1/groups/{name}/heartbeat", JOIN, MEMBER),
                ("POST", f"/v1/streams/{name}/scale", {"shards": 3}, ADMIN),
            ):
                url = httpx.URL(rt.http_url + path)  # sent as written (already encoded)
                response = await http.request(method, url, json=body, headers=headers)
                assert_error(response, 400, 404)
        # Not normalised: dot segments and doubled slashes sent raw never reach a route.
        for raw in (b"/v1/streams/../../v1/status", b"/v1/../v1/status", b"//v1/status"):
            status, _, body = await _raw_request(rt, b"GET " + raw + b" HTTP/1.1\r\n")
            assert status == 404, (raw, body)
        assert await _metadata(rt) == before


async def test_a_trailing_newline_in_a_path_name_is_refused(streamworks_redis_url: str) -> None:
    async with live(streamworks_redis_url) as (rt, http, _):
        before = await _metadata(rt)
        url = httpx.URL(f"{rt.http_url}/v1/groups/hostile%0A/heartbeat")
        response = await http.post(url, json=JOIN, headers=MEMBER)
        assert await _metadata(rt) == before, await _metadata(rt)
        assert_error(response, 400)


async def test_wrong_content_types_and_empty_bodies(streamworks_redis_url: str) -> None:
    async with live(streamworks_redis_url) as (rt, http, _):
        before = await _metadata(rt)
        for path, body, headers in POSTS:
            text = json.dumps(body)
            sends: list[dict[str, Any]] = [
                {"content": text, "headers": {"content-type": "text/plain"}},
                {"content": "<body/>", "headers": {"content-type": "application/xml"}},
                {"data": {k: str(v) for k, v in body.items()}},  # a form
                {"files": {"body": ("body.json", text.encode(), "application/json")}},
                *(
                    {"content": raw, "headers": JSON}
                    for raw in (
                        b"",
                        b" ",
                        b"null",
                        b"{}",
                        b"[]",
                        b'""',
                        b"0",
                        b"\x00",
                        b"\xef\xbb\xbf",
                    )
                ),
            ]
            for send in sends:
                send["headers"] = {**headers, **send.get("headers", {})}
                response = await http.post(path, **send)
                assert_error(response, 400, 422)
        # Bodies where none is expected are ignored, not fatal.
        response = await http.request("GET", "/v1/status", content=b"\xff" * 1000, headers=MEMBER)
        assert response.status_code == 200
        assert await _metadata(rt) == before


async def test_duplicate_keys_take_the_last_value(streamworks_redis_url: str) -> None:
    """JSON with a key given twice: the last value counts (Python's json, like most
    parsers); the first one never reaches the metadata."""
    async with live(streamworks_redis_url) as (rt, http, _):
        streams, groups = await _metadata(rt)
        send = {"headers": {**ADMIN, **JSON}}
        response = await http.post(
            "/v1/streams", content=b'{"name": "bad/name", "name": "dup", "shards": 1}', **send
        )
        assert response.status_code == 200 and response.json()["name"] == "dup"
        response = await http.post(
            "/v1/streams", content=b'{"name": "dup2", "shards": 1, "shards": 99999}', **send
        )
        assert_error(response, 422)
        response = await http.post(
            "/v1/groups/hostile/heartbeat",
            content=b'{"memberId": "h1", "memberEpoch": 0, "memberEpoch": -5}',
            headers={**MEMBER, **JSON},
        )
        assert_error(response, 422)
        assert await _metadata(rt) == (sorted([*streams, "dup"]), groups)


async def _raw_request(
    rt: TestRuntime, head: bytes, extra: bytes = b""
) -> tuple[int, bytes, bytes]:
    """Send a request byte for byte; (status, headers, body). The connection closes."""
    assert rt.http_url is not None
    port = int(rt.http_url.rsplit(":", 1)[1])
    request = head + b"Host: x\r\nAuthorization: Bearer " + MEMBER_TOKEN.encode() + b"\r\n"
    request += extra + b"Connection: close\r\n\r\n"
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(request)
        data = b""
        with anyio.fail_after(10):
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while True:
                    data += await stream.receive()
    headers, _, body = data.partition(b"\r\n\r\n")
    match = re.match(rb"HTTP/1\.1 (\d{3})", headers)
    assert match is not None, data[:200]
    return int(match.group(1)), headers, body


async def test_very_long_urls_and_headers(streamworks_redis_url: str) -> None:
    async with live(streamworks_redis_url) as (rt, http, _):
        # Up to what HTTP clients send (64 KiB): the API's own 400.
        for path in ("/v1/streams/" + "a" * 60_000, "/v1/groups/" + "%2e" * 20_000):
            assert_error(await http.get(path, headers=MEMBER), 400)
        response = await http.get("/v1/status?" + "x=1&" * 15_000, headers=MEMBER)
        assert response.status_code == 200  # unknown query parameters are ignored
        # Beyond: uvicorn refuses the request line itself (plain text, before the API).
        status, _, body = await _raw_request(
            rt, b"GET /v1/streams/" + b"a" * (1 << 20) + b" HTTP/1.1\r\n"
        )
        assert status == 400, body
        # Headers: a 1 MiB one and 2000 of them are read and ignored; a huge bearer
        # token is just a wrong one.
        status, _, body = await _raw_request(
            rt, b"GET /v1/status HTTP/1.1\r\n", b"X-Big: " + b"y" * (1 << 20) + b"\r\n"
        )
        assert status == 200, body
        many = {f"x-h{i}": "v" for i in range(2000)}
        assert (await http.get("/v1/status", headers={**MEMBER, **many})).status_code == 200
        huge_token = {"authorization": "Bearer " + "t" * 100_000}
        assert_error(await http.get("/v1/status", headers=huge_token), 401)
        latin1 = [(b"authorization", b"Bearer \xff\xfe")]
        assert_error(await http.get("/v1/status", headers=latin1), 401)


@pytest.mark.timeout(300)
async def test_thousands_of_concurrent_bad_requests(streamworks_redis_url: str) -> None:
    total, parallel = 2100, 500  # six kinds of bad request, 350 of each
    async with live(streamworks_redis_url) as (rt, http, _):
        before = await _metadata(rt)
        command = [sys.executable, "-m", "tests.badinput.flood", str(http.base_url)]
        command += [MEMBER_TOKEN, str(total), str(parallel)]
        with anyio.fail_after(240):
            done = await anyio.run_process(command, env=child_env({}), cwd=REPO, check=False)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        report = json.loads(done.stdout)
        assert report["problems"] == []
        statuses = {int(k): v for k, v in report["statuses"].items()}
        assert sum(statuses.values()) == total, statuses
        # A third each: 401 (wrong token, admin operation with the member token), 404
        # (traversal, unknown path), 422 (unparsable body, epoch out of range).
        assert statuses == {401: total // 3, 404: total // 3, 422: total // 3}, statuses
        assert await _metadata(rt) == before

"""A flood of bad requests against a coordinator, from a process of its own (so the
coordinator under test, in the test process, has a core to itself).

``python -m tests.badinput.flood BASE_URL MEMBER_TOKEN TOTAL PARALLEL`` sends TOTAL bad
requests over PARALLEL connections at once and prints one JSON object: how many
answers each status had, and the first answers that were not a well-formed error.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import httpx


def bad_request(i: int, token: str) -> tuple[str, str, dict[str, Any]]:
    """The ``i``-th request of the flood: six kinds of bad, in turn."""
    member = {"authorization": f"Bearer {token}"}
    heartbeat = "/v1/groups/hostile/heartbeat"
    join = {"memberId": f"f{i}", "memberEpoch": -9, "subscriptions": ["other"]}
    kind = i % 6
    if kind == 0:
        return "POST", heartbeat, {"content": b"{", "headers": member}
    if kind == 1:
        return "POST", heartbeat, {"json": join, "headers": member}
    if kind == 2:
        return "GET", "/v1/status", {"headers": {"authorization": f"Bearer wrong-{i}"}}
    if kind == 3:
        return "GET", f"/v1/streams/..%2F{i}", {"headers": member}
    if kind == 4:  # an admin operation with the member token
        return "POST", "/v1/streams", {"json": {"name": f"s{i}", "shards": 1}, "headers": member}
    return "GET", f"/v1/nothing/{i}", {"headers": member}


def problem(response: httpx.Response) -> str | None:
    """What is wrong with a response that should be a 4xx error, or None."""
    if not 400 <= response.status_code < 500:
        return f"status {response.status_code}"
    if not response.headers.get("content-type", "").startswith("application/json"):
        return f"content type {response.headers.get('content-type')!r}"
    body = response.json()
    if not isinstance(body, dict) or set(body) != {"error", "message", "retryable"}:
        return f"body {body!r}"[:300]
    return None


async def flood(base_url: str, token: str, total: int, parallel: int) -> dict[str, Any]:
    statuses: dict[int, int] = {}
    problems: list[str] = []
    limits = httpx.Limits(max_connections=parallel, max_keepalive_connections=parallel)
    send, receive = anyio.create_memory_object_stream[int](total)
    for i in range(total):
        send.send_nowait(i)
    send.close()
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as http:

        async def client() -> None:
            async for i in receive:
                method, path, kwargs = bad_request(i, token)
                response = await http.request(method, path, **kwargs)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                found = problem(response)
                if found is not None and len(problems) < 5:
                    problems.append(f"{method} {path}: {found}")

        async with anyio.create_task_group() as tg:
            for _ in range(parallel):
                tg.start_soon(client)
    return {"statuses": statuses, "problems": problems}


def main() -> None:
    base_url, token, total, parallel = sys.argv[1:]
    print(json.dumps(anyio.run(flood, base_url, token, int(total), int(parallel))))


if __name__ == "__main__":
    main()

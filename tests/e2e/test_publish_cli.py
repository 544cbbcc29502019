"""``streamworks publish`` against a real coordinator: one JSON value or JSON lines,
through the producer's routing; a bad line stops it with its line number after
publishing exactly the lines before it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from streamworks.protocol.envelope import parse_fields
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from tests.e2e.harness import STREAM, Cluster, create_stream, wait_ready
from tests.e2e.test_cli import assert_one_error_line, text


async def entries(redis: Any, prefix: str, shard: str) -> list[Any]:
    key = Keyspace(prefix).stream(ShardId.parse(shard))
    return [parse_fields(_flat(f)) for _, f in await redis.xrange(key)]


def _flat(fields: dict[bytes, bytes]) -> list[bytes]:
    return [x for pair in fields.items() for x in pair]


async def total(redis: Any, prefix: str) -> int:
    keyspace = Keyspace(prefix)
    return sum([await redis.xlen(keyspace.stream(ShardId(STREAM, i))) for i in range(6)])


async def test_publish_a_value_and_json_lines(cluster: Cluster, redis: Any, tmp_path: Path) -> None:
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)

    one = await cluster.cli(
        "publish", STREAM, '{"id": 1}', "--key", "k1", "--event-id", "e-1",
        "--header", "source=cli", "--header", "trace=a=b", "--json",
    )  # fmt: skip
    assert one.returncode == 0, text(one)
    result = orjson.loads(one.stdout)
    assert result["stream"] == STREAM and not result["duplicate"]
    [(payload, key, event_id, headers, _)] = await entries(redis, cluster.prefix, result["shard"])
    assert orjson.loads(payload) == {"id": 1} and (key, event_id) == ("k1", "e-1")
    assert dict(headers) == {"source": "cli", "trace": "a=b"}
    human = await cluster.cli("publish", STREAM, '"text"', "--key", "k1")
    assert human.returncode == 0, text(human)
    assert f"published to {result['shard']} as " in text(human)[0]  # same key, same shard

    # stdin: line 3 is not JSON: lines 1 and 2 are published, line 4 is not.
    lines = b'{"n": 1}\n{"n": 2}\n{"n": 3\n{"n": 4}\n'
    bad = await cluster.cli("publish", STREAM, "-", input=lines)
    assert_one_error_line(bad, "stdin line 3", "not JSON", "2 messages published before it")
    assert await total(redis, cluster.prefix) == 4

    # A file of records, each with its own key, event id and headers.
    path = tmp_path / "orders.jsonl"
    path.write_bytes(
        b"".join(
            orjson.dumps({"value": {"n": n}, "key": f"k{n % 3}", "headers": {"n": str(n)}}) + b"\n"
            for n in range(450)
        )
    )
    many = await cluster.cli("publish", STREAM, "--file", str(path), "--records", "--json")
    assert many.returncode == 0, text(many)
    published = [orjson.loads(line) for line in many.stdout.splitlines()]
    assert len(published) == 450
    by_key: dict[str, set[str]] = {}
    for n, p in enumerate(published):
        by_key.setdefault(f"k{n % 3}", set()).add(p["shard"])
    assert all(len(shards) == 1 for shards in by_key.values()), by_key
    assert await total(redis, cluster.prefix) == 454
    summary = await cluster.cli("publish", STREAM, "--file", str(path), "--records")
    assert "published 450 messages to events" in text(summary)[0], text(summary)

    for args, fragment in (
        (["publish", STREAM, "{nope"], "VALUE is not JSON"),
        (["publish", STREAM], "nothing to publish"),
        (["publish", "bad name!", "1"], "invalid stream name"),
        (["publish", STREAM, "1", "--header", "novalue"], "NAME=VALUE"),
        (["publish", "no-such-stream", "1"], "no-such-stream"),
    ):
        assert_one_error_line(await cluster.cli(*args), fragment)

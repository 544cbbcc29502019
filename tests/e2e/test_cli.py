"""The ``streamworks`` command line against real processes.

User mistakes end with one clear error line and a non-zero exit, never a traceback;
the topology, status and dead-letter commands work against a live coordinator;
``streamworks dev`` starts, prints its coordinator URL and stops on Ctrl-C.
"""

from __future__ import annotations

import re
import signal
import subprocess
from typing import Any

import anyio
import orjson
import pytest

from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.control import StatusResponse, StreamInfo
from streamworks.redis.keyspace import Keyspace
from tests.e2e.apps import instrumented
from tests.e2e.harness import (
    GROUP,
    INSTRUMENTED,
    STREAM,
    Cluster,
    create_stream,
    free_port,
    processings,
    producer_app,
    wait_ready,
    wait_stable,
    wait_until,
)

WIDE = {"COLUMNS": "200"}  # rich tables are not wrapped or cut in captured output


def text(result: subprocess.CompletedProcess[bytes]) -> tuple[str, str]:
    return result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")


def assert_one_error_line(result: subprocess.CompletedProcess[bytes], *fragments: str) -> None:
    out, err = text(result)
    assert result.returncode != 0, (out, err)
    assert "Traceback" not in out + err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].lower().startswith("error:"), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


async def test_user_mistakes_print_one_error_line(cluster: Cluster) -> None:
    """Bad module path, missing attribute, not an App, unreachable Redis, unreachable
    coordinator, unknown stream: one line on stderr, exit code non-zero."""
    coordinator = cluster.start_coordinator()
    closed_redis = f"redis://127.0.0.1:{free_port()}/0"
    closed_coordinator = f"http://127.0.0.1:{free_port()}"
    cases: dict[str, tuple[list[str], tuple[str, ...]]] = {
        "bad module": (["worker", "no_such_module.app:app"], ("no_such_module",)),
        "missing attribute": (["worker", "tests.e2e.apps.instrumented:nope"], ("nope",)),
        "not an App": (
            ["worker", "tests.e2e.apps.instrumented:STREAM"],
            ("not a streamworks.App",),
        ),
        "worker, Redis unreachable": (
            ["worker", INSTRUMENTED, "--redis", closed_redis],
            ("Redis",),
        ),
        "coordinator, Redis unreachable": (["coordinator", "--redis", closed_redis], ("Redis",)),
        "dlq, Redis unreachable": (["dlq", "ls", "--redis", closed_redis], ("Redis",)),
        "status, coordinator unreachable": (
            ["status", "--coordinator", closed_coordinator],
            ("coordinator", closed_coordinator),
        ),
        "streams create, coordinator unreachable": (
            ["streams", "create", "x", "--shards", "1", "--coordinator", closed_coordinator],
            ("coordinator",),
        ),
    }
    results: dict[str, subprocess.CompletedProcess[bytes]] = {}

    async def run(name: str, args: list[str]) -> None:
        results[name] = await cluster.cli(*args)

    async with anyio.create_task_group() as tg:
        for name, (args, _) in cases.items():
            tg.start_soon(run, name, args)
    for name, (_, fragments) in cases.items():
        try:
            assert_one_error_line(results[name], *fragments)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None
    await wait_ready(coordinator)
    unknown = await cluster.cli("streams", "show", "no-such-stream")
    assert_one_error_line(unknown, "no-such-stream")


async def test_streams_and_status_against_a_live_coordinator(cluster: Cluster) -> None:
    """``streams create`` / ``ls`` / ``show`` and ``status --json`` through a coordinator."""
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    created = await cluster.cli("streams", "create", "payments", "--shards", "3", env=WIDE)
    assert created.returncode == 0, text(created)
    assert "created stream payments with 3 shards" in text(created)[0]
    again = await cluster.cli("streams", "create", "payments", "--shards", "3", env=WIDE)
    assert again.returncode == 0 and "exists" in text(again)[0], text(again)

    listed = await cluster.cli("streams", "ls", env=WIDE)
    assert listed.returncode == 0, text(listed)
    assert re.search(r"payments\s+3 shards \(3 active\)", text(listed)[0]), text(listed)[0]

    shown = await cluster.cli("streams", "show", "payments", "--json")
    assert shown.returncode == 0, text(shown)
    info = StreamInfo.model_validate_json(shown.stdout)
    assert info.name == "payments" and info.shard_count == 3
    assert [s.shard for s in info.shards] == [f"payments/{i}@0" for i in range(3)]
    assert all(s.state == "ACTIVE" for s in info.shards)

    table = await cluster.cli("streams", "show", "payments", env=WIDE)
    assert table.returncode == 0 and "payments/2@0" in text(table)[0], text(table)

    worker = cluster.start_worker("worker")
    async with cluster.client() as client:
        await wait_stable(client, 1)
    status = await cluster.cli("status", "--json")
    assert status.returncode == 0, text(status)
    raw = orjson.loads(status.stdout)
    assert {s["name"] for s in raw["streams"]} == {"payments", STREAM}
    parsed = StatusResponse.model_validate(raw)
    (group,) = parsed.groups
    assert group.group == GROUP and group.state == "STABLE"
    (member,) = group.members
    assert member.client["pid"] == str(worker.pid)
    assert len(member.assigned) == instrumented.SHARDS

    human = await cluster.cli("status", env=WIDE)
    assert human.returncode == 0 and f"group {GROUP}" in text(human)[0], text(human)


async def test_dlq_ls_show_replay_purge(cluster: Cluster, redis: Any) -> None:
    """A handler that keeps failing dead-letters its events after ``max_attempts``;
    ``dlq ls`` and ``show`` list them, ``replay`` hands one back to the group through
    its redelivery stream of the key's shard (a new entry, handled once it can
    succeed) and ``purge`` drops the rest."""
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    cluster.start_worker("worker")
    keyspace = Keyspace(cluster.prefix)
    dlq_key = keyspace.dead_letters(GROUP, STREAM)
    app = producer_app(cluster)
    async with cluster.client() as client, app.connect():
        await wait_stable(client, 1)
        for event_id in ("dlq-1", "dlq-2"):
            await app.publish(STREAM, {"id": event_id, "fail_until_healed": True}, key=event_id)

        async def dead_lettered() -> bool:
            return await redis.xlen(dlq_key) == 2

        await wait_until(dead_lettered, 15, "two dead letters")
        (first_id, first), (_, second) = await redis.xrange(dlq_key)
        assert first[b"reason"] == b"max_attempts"
        assert first[b"attempts"] == str(instrumented.MAX_ATTEMPTS).encode()

        listed = await cluster.cli("dlq", "ls", env=WIDE)
        assert listed.returncode == 0, text(listed)
        assert re.search(rf"{GROUP}\s+│\s+{STREAM}\s+│\s+2", text(listed)[0]), text(listed)[0]
        shown = await cluster.cli("dlq", "show", GROUP, STREAM, env=WIDE)
        assert shown.returncode == 0, text(shown)
        assert "max_attempts" in text(shown)[0] and "NotHealed" in text(shown)[0]
        assert first_id.decode() in text(shown)[0]

        healed = orjson.loads(first[b"o.v"])["id"]
        await redis.set(instrumented.healed_key(cluster.prefix, healed), 1)
        replayed = await cluster.cli("dlq", "replay", GROUP, STREAM, "--limit", "1", env=WIDE)
        assert replayed.returncode == 0, text(replayed)
        assert "replayed 1" in text(replayed)[0]

        async def handled() -> bool:
            records = await processings(redis, cluster.prefix)
            return any(p.id == healed and p.end is not None for p in records)

        await wait_until(handled, 15, f"{healed} handled after the replay")
        (done,) = [p for p in await processings(redis, cluster.prefix) if p.end is not None]
        # Redelivered through routing: a new entry, on the shard its key routes to.
        assert done.entry != first[b"entry_id"].decode()
        assert done.shard == first[b"shard"].decode()
        assert done.attempt == 1
        remaining = await redis.xrange(dlq_key)
        assert [fields for _, fields in remaining] == [second]

        purged = await cluster.cli("dlq", "purge", GROUP, STREAM, "--yes", env=WIDE)
        assert purged.returncode == 0 and "purged 1" in text(purged)[0], text(purged)
        assert await redis.xlen(dlq_key) == 0
        after = await cluster.cli("dlq", "ls", env=WIDE)
        assert after.returncode == 0 and STREAM not in text(after)[0], text(after)

        # Poison dead letters (headers not JSON, a key not UTF-8) are kept and reported,
        # and the replay goes on past them.
        await redis.xadd(dlq_key, {"reason": "poison", "o.v": b"{}", "o.h": b"{nope"})
        await redis.xadd(dlq_key, {"reason": "poison", "o.v": b"{}", "o.k": b"\xff\xfe"})
        kept = await cluster.cli("dlq", "replay", GROUP, STREAM, env=WIDE)
        assert kept.returncode == 0, text(kept)
        assert re.search(r"replayed 0 .*kept 2", text(kept)[0]), text(kept)
        assert await redis.xlen(dlq_key) == 2


async def test_dev_starts_prints_its_coordinator_and_stops_on_sigint(cluster: Cluster) -> None:
    """``streamworks dev examples.orders.app:app --workers 2``: an embedded Redis (even
    when the environment names another), a coordinator and two workers in one process;
    the printed URL answers; Ctrl-C (SIGINT) stops everything, including its Redis."""
    # A test Redis named in its environment must not be used: dev runs its own.
    env = {**WIDE, "STREAMWORKS_TEST_REDIS_URL": cluster.redis_url}
    port = free_port()
    dev = cluster.start(
        "dev", "dev", "examples.orders.app:app", "--workers", "2", "--port", str(port), env=env
    )

    async def printed_url() -> tuple[str, str] | None:
        if not dev.alive():
            raise AssertionError(f"dev exited ({dev.popen.poll()}):\n{dev.output()}")
        found = re.search(r"coordinator: (http://\S+)\s+Redis: (redis://\S+)", dev.output())
        return (found[1], found[2]) if found else None

    url, redis_url = await wait_until(printed_url, 30, "dev to print its coordinator URL", 0.1)
    assert redis_url != cluster.redis_url
    assert url == f"http://127.0.0.1:{port}"  # the fixed --port
    assert f"key prefix: {cluster.prefix}" in dev.output()  # printed, not random
    async with CoordinatorClient([url]) as client:

        async def two_members() -> bool:
            group = await client.group("billing")
            return group.state == "STABLE" and len(group.members) == 2

        await wait_until(two_members, 20, "the billing group with two members")
    status = await cluster.cli("status", "--json", "--coordinator", url)
    assert status.returncode == 0, text(status)
    assert [g["group"] for g in orjson.loads(status.stdout)["groups"]] == ["billing"]

    dev.send(signal.SIGINT)
    assert await dev.wait_exit(20) == 0, dev.output()[-3000:]
    assert "stopping" in dev.output()
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(OSError):
        await anyio.connect_tcp("127.0.0.1", port)

"""``streamworks dlq`` against real processes: selection by id and filters, ``--json``
on every command, ``--dry-run``, confirmation, and unknown groups or streams as errors.

(Replay reaching only the DLQ's group is tested in tests/runtime/test_redelivery.py;
``test_cli.py`` replays through a real worker.)"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from typing import Any

import anyio.to_thread
import orjson

from streamworks.redis.keyspace import Keyspace
from tests.e2e.harness import (
    GROUP,
    REPO,
    STREAM,
    Cluster,
    create_stream,
    wait_ready,
    wait_stable,
)
from tests.e2e.test_cli import assert_one_error_line, text

NARROW = {"COLUMNS": "80"}  # an explicit width still wins...


async def dead_letters(redis: Any, key: str) -> list[str]:
    """Three synthetic dead letters: two poison (one old), one max_attempts."""
    old_ms = int(time.time() * 1000) - 3 * 3600 * 1000
    ids = [
        await redis.xadd(
            key,
            {"reason": "poison", "error": "DecodeError: not JSON", "o.v": b"x", "shard": "a"},
            id=f"{old_ms}-0",
        ),
        await redis.xadd(
            key,
            {
                "reason": "max_attempts",
                "error": "ValueError: Price must be positive " + "x" * 150,
                "traceback": 'Traceback (most recent call last):\n  File "h.py"\nValueError',
                "o.v": b'{"n": 1}',
                "o.k": b"k1",
            },
        ),
        await redis.xadd(key, {"reason": "poison", "error": "DecodeError: bad", "o.v": b"y"}),
    ]
    return [i.decode() for i in ids]


async def test_dlq_selection_json_dry_run_and_confirmation(cluster: Cluster, redis: Any) -> None:
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    cluster.start_worker("worker")
    async with cluster.client() as client:
        await wait_stable(client, 1)
    key = Keyspace(cluster.prefix).dead_letters(GROUP, STREAM)
    old, priced, bad = await dead_letters(redis, key)

    # Unknown group or stream, or one that does not consume it: exit 2, one line.
    for args, fragment in (
        (["dlq", "show", "no-such-group", STREAM], "unknown group 'no-such-group'"),
        (["dlq", "show", GROUP, "no-such-stream"], "unknown stream 'no-such-stream'"),
        (["dlq", "replay", "nope", STREAM], "unknown group"),
        (["dlq", "purge", GROUP, "nope", "--yes"], "unknown stream"),
        (["dlq", "delete", GROUP, STREAM, "1-0", "--yes"], "no dead letter 1-0"),
        (["dlq", "show", GROUP, STREAM, "not-an-id"], "not a dead-letter id"),
        (["dlq", "show", GROUP, STREAM, "--older-than", "soon"], "not an age"),
    ):
        result = await cluster.cli(*args)
        assert_one_error_line(result, fragment)
        assert result.returncode == 2, (args, text(result))

    # --json on ls and show; filters by reason, error text and age.
    listed = orjson.loads((await cluster.cli("dlq", "ls", "--json")).stdout)
    assert listed["dead_letter_streams"][0]["entries"] == 3

    async def show(*args: str) -> list[str]:
        result = await cluster.cli("dlq", "show", GROUP, STREAM, "--json", *args)
        assert result.returncode == 0, text(result)
        return [e["id"] for e in orjson.loads(result.stdout)["entries"]]

    assert await show() == [old, priced, bad]
    assert await show("--reason", "poison") == [old, bad]
    assert await show("--error", "price MUST") == [priced]  # case-insensitive substring
    assert await show("--older-than", "1h") == [old]
    assert await show("--newer-than", "1h") == [priced, bad]
    assert await show(bad, old) == [old, bad]
    # One id: the whole entry, traceback included; piped tables are not cut at 80.
    one = await cluster.cli("dlq", "show", GROUP, STREAM, priced)
    assert one.returncode == 0 and "ValueError" in text(one)[0], text(one)
    assert "Traceback (most recent call last)" in text(one)[0]
    wide = await cluster.cli("dlq", "show", GROUP, STREAM)
    assert max(len(line) for line in text(wide)[0].splitlines()) > 100, text(wide)[0]

    # delete: refused without a terminal unless --yes; --dry-run deletes nothing.
    refused = await cluster.cli("dlq", "delete", GROUP, STREAM, "--reason", "poison")
    assert_one_error_line(refused, "--yes")
    dry = await cluster.cli("dlq", "delete", GROUP, STREAM, "--reason", "poison", "--dry-run")
    assert dry.returncode == 0 and "would delete 2" in text(dry)[0], text(dry)
    everything = await cluster.cli("dlq", "delete", GROUP, STREAM, "--yes")
    assert_one_error_line(everything, "dlq purge")
    assert await redis.xlen(key) == 3
    deleted = await cluster.cli("dlq", "delete", GROUP, STREAM, old, "--yes", "--json")
    assert deleted.returncode == 0, text(deleted)
    assert orjson.loads(deleted.stdout)["ids"] == [old]
    assert [i.decode() for i, _ in await redis.xrange(key)] == [priced, bad]

    # replay --dry-run names the target shard and changes nothing.
    planned = await cluster.cli("dlq", "replay", GROUP, STREAM, priced, "--dry-run", "--json")
    assert planned.returncode == 0, text(planned)
    plan = orjson.loads(planned.stdout)
    assert plan["dry_run"] and plan["replayed"][0]["id"] == priced
    assert plan["replayed"][0]["shard"].startswith(f"{STREAM}/")
    assert await redis.xlen(key) == 2

    # purge: --dry-run counts, refused without --yes, --json with --yes.
    counted = await cluster.cli("dlq", "purge", GROUP, STREAM, "--dry-run", "--json")
    assert orjson.loads(counted.stdout)["deleted"] == 2
    assert_one_error_line(await cluster.cli("dlq", "purge", GROUP, STREAM), "--yes")
    purged = await cluster.cli("dlq", "purge", GROUP, STREAM, "--yes", "--json")
    assert purged.returncode == 0 and orjson.loads(purged.stdout)["deleted"] == 2
    assert not await redis.exists(key)
    empty = await cluster.cli("dlq", "ls")
    assert empty.returncode == 0 and "no dead letters" in text(empty)[0], text(empty)


def run_in_terminal(cluster: Cluster, args: list[str], answer: bytes) -> tuple[int, str]:
    """Run a command on a pseudo-terminal, answer its prompt; (exit code, output)."""
    primary, secondary = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamworks", *args],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env=cluster.env({"COLUMNS": "200"}),
        cwd=REPO,
    )
    os.close(secondary)
    output = b""
    deadline = time.monotonic() + 30
    answered = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(primary, 4096)
                except OSError:  # the terminal closed: the process exited
                    break
                if not chunk:
                    break
                output += chunk
                if not answered and b"[y/N]" in output:
                    os.write(primary, answer)
                    answered = True
            elif proc.poll() is not None:
                break
        code = proc.wait(10)
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
    return code, re.sub(r"\x1b\[[0-9;]*m", "", output.decode(errors="replace"))


async def test_delete_and_purge_ask_on_a_terminal(cluster: Cluster, redis: Any) -> None:
    key = Keyspace(cluster.prefix).dead_letters(GROUP, STREAM)
    await redis.xadd(key, {"reason": "poison", "error": "DecodeError: x", "o.v": b"x"})
    code, out = await anyio.to_thread.run_sync(
        run_in_terminal, cluster, ["dlq", "purge", GROUP, STREAM], b"n\n"
    )
    assert code != 0 and "delete every dead letter" in out and "aborted" in out, out
    assert await redis.xlen(key) == 1
    code, out = await anyio.to_thread.run_sync(
        run_in_terminal, cluster, ["dlq", "purge", GROUP, STREAM], b"y\n"
    )
    assert code == 0 and re.search(r"purged 1 dead letter\b(?!s)", out), out  # "1 letters"
    assert not await redis.exists(key)

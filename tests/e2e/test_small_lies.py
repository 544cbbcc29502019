"""What a new user's first commands said that was not true (issue 22, items 5, 7, 9),
on real processes: a scale to 0 shards that did not ask, an import error without its
file and line, a dry run that claimed to remove, ``owner`` always null, no dead-letter
counts in ``status``, no hint for a member with no shards, no log line when a shard
is taken away, ``ctx.logger`` under ``streamworks.app``, wrapped titles, "1 shards"."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson
import pytest

from streamworks import App, Context
from streamworks.redis.keyspace import Keyspace
from streamworks.testing import TestRuntime
from tests.e2e.harness import (
    GROUP,
    REPO,
    STREAM,
    Cluster,
    create_stream,
    free_port,
    wait_ready,
    wait_stable,
)
from tests.e2e.test_cli import assert_one_error_line, text
from tests.e2e.test_dlq_cli import run_in_terminal


async def test_scaling_to_zero_shards_asks_first(cluster: Cluster) -> None:
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    args = ["streams", "scale", STREAM, "--shards", "0", "--coordinator", coordinator.url]

    async def shards() -> int:
        async with cluster.client() as client:
            return (await client.stream(STREAM)).shard_count

    before = await shards()
    refused = await cluster.cli(*args)  # no terminal to ask on
    assert_one_error_line(refused, "--yes")
    assert refused.returncode == 2 and await shards() == before
    code, out = await anyio.to_thread.run_sync(run_in_terminal, cluster, args, b"n\n")
    assert code == 1 and "Every publish to it fails" in out and "aborted" in out, out
    assert await shards() == before
    code, out = await anyio.to_thread.run_sync(run_in_terminal, cluster, args, b"y\n")
    assert code == 0 and "routing now has 0 shards" in out, out
    assert await shards() == 0
    scaled = await cluster.cli("streams", "scale", STREAM, "--shards", "2", "--yes")
    assert scaled.returncode == 0 and "routing now has 2 shards" in text(scaled)[0]
    one = await cluster.cli("streams", "scale", STREAM, "--shards", "1")  # only 0 asks
    assert one.returncode == 0 and "routing now has 1 shard " in text(one)[0], text(one)


async def test_an_import_error_shows_the_users_frames(tmp_path: Path) -> None:
    (tmp_path / "raises.py").write_text("import helper\n")
    (tmp_path / "helper.py").write_text(
        'def boom():\n    raise RuntimeError("boom at import")\n\nboom()\n'
    )
    done = await anyio.run_process(
        [sys.executable, "-m", "streamworks", "worker", "raises:app", "--log-level", "debug"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": str(Path(sys.executable).parent)},
        check=False,
    )
    err = done.stderr.decode()
    assert done.returncode == 1, err
    helper = tmp_path / "helper.py"
    assert f'File "{tmp_path / "raises.py"}", line 1, in <module>' in err, err
    assert f'File "{helper}", line 4, in <module>' in err
    assert f'File "{helper}", line 2, in boom' in err
    assert 'raise RuntimeError("boom at import")' in err
    assert "<frozen" not in err and "streamworks/cli" not in err, err  # the user's frames only
    last = err.strip().splitlines()[-1]
    assert last == (
        f"error: importing 'raises' failed: RuntimeError: boom at import ({helper}, line 2)"
    )


async def test_a_dry_run_never_says_it_removed_anything(cluster: Cluster, redis: Any) -> None:
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    cluster.start_worker("worker")
    async with cluster.client() as client:
        await wait_stable(client, 1)
    key = Keyspace(cluster.prefix).dead_letters(GROUP, STREAM)
    await redis.xadd(key, {"reason": "max_attempts", "error": "x", "o.v": b"{}", "o.k": b"k1"})
    dry = await cluster.cli("dlq", "replay", GROUP, STREAM, "--dry-run")
    out = text(dry)[0]
    assert dry.returncode == 0 and "nothing was changed" in out, out
    assert "removed" not in out
    # The coordinator gone: the dry run stops, and says nothing about removing.
    down = f"http://127.0.0.1:{free_port()}"
    stopped = await cluster.cli("dlq", "replay", GROUP, STREAM, "--dry-run", "--coordinator", down)
    assert_one_error_line(stopped)
    assert "removed" not in text(stopped)[1], text(stopped)[1]
    assert await redis.xlen(key) == 1


async def test_status_says_who_owns_what_dead_letters_hints_and_plurals(
    cluster: Cluster, redis: Any
) -> None:
    shards = {"E2E_SHARDS": "2"}
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    async with cluster.client() as client:
        await client.create_stream(STREAM, 2)
        first = cluster.start_worker("first", **shards)
        await wait_stable(client, 1)
        cluster.start_worker("second", **shards)
        await wait_stable(client, 2)
        cluster.start_worker("third", **shards)
        group = await wait_stable(client, 3)  # three members, two shards: one idle
        await client.create_stream("solo", 1)
    # A shard taken away is logged by the member that gives it up.
    assert re.search(rf"giving {STREAM}/\d@0 up \(revoked", first.output()), first.output()
    key = Keyspace(cluster.prefix).dead_letters(GROUP, STREAM)
    for n in range(2):
        await redis.xadd(key, {"reason": "poison", "error": "x", "o.v": str(n).encode()})

    as_json = orjson.loads((await cluster.cli("status", "--json")).stdout)
    owners = {m.member_id for m in group.members if m.assigned}
    [events] = [s for s in as_json["streams"] if s["name"] == STREAM]
    for shard in events["shards"]:
        [position] = shard["groups"]
        assert position["owner"] in owners, position  # was always null
    [ours] = [g for g in as_json["groups"] if g["group"] == GROUP]
    assert ours["deadLetters"] == {STREAM: 2}

    shown = await cluster.cli("status", env={"COLUMNS": "60"})  # a narrow terminal
    out = text(shown)[0]
    assert shown.returncode == 0, text(shown)
    lines = out.splitlines()
    # Titles are one line each, however narrow the tables are.
    assert "stream events: 2 routable shards, routing v1 (jump-xxh64-v1)" in lines
    assert "stream solo: 1 routable shard, routing v1 (jump-xxh64-v1)" in lines  # not "1 shards"
    assert any(line.startswith(f"group {GROUP}: STABLE, epoch ") for line in lines), out
    assert f"dead letters: {STREAM} 2" in out
    hint = " ".join(out.split())
    assert "1 member has no shards: the group has 3 members for 2 shards" in hint, out


async def test_ctx_logger_logs_under_the_apps_name(
    streamworks_redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = App("invoicing")
    app.stream("bills", shards=1)

    @app.handler("bills")
    async def bill(value: dict[str, str], ctx: Context) -> None:
        ctx.logger.info("billing %s", value["id"])

    caplog.set_level(logging.INFO)
    async with TestRuntime(app, redis_url=streamworks_redis_url) as rt:
        await app.publish("bills", {"id": "b-1"})
        await rt.wait_idle(timeout=10)
    [record] = [r for r in caplog.records if r.getMessage() == "billing b-1"]
    assert record.name == "invoicing"  # was streamworks.app
    assert record.group == "invoicing" and record.stream == "bills"  # type: ignore[attr-defined]

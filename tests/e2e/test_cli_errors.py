"""Mistakes a person makes on the command line (issue 12): each is one error line and a
non-zero exit, never a traceback; logs say where and why; ``--log-format json``."""

from __future__ import annotations

import re
import socket
from typing import Any

import click
import orjson

from streamworks.cli import cli
from tests.e2e.harness import (
    INSTRUMENTED,
    Cluster,
    create_stream,
    free_port,
    wait_ready,
    wait_until,
)
from tests.e2e.test_cli import assert_one_error_line

BAD_REDIS = "http://127.0.0.1:6379/0"

#: Arguments that get each command taking --redis past its own argument checks.
REDIS_COMMANDS: dict[str, list[str]] = {
    "worker": ["worker", INSTRUMENTED],
    "coordinator": ["coordinator"],
    "publish": ["publish", "orders", "1"],
    "dlq ls": ["dlq", "ls"],
    "dlq show": ["dlq", "show", "g", "s"],
    "dlq replay": ["dlq", "replay", "g", "s"],
    "dlq delete": ["dlq", "delete", "g", "s", "--reason", "poison", "--yes"],
    "dlq purge": ["dlq", "purge", "g", "s", "--yes"],
}


def commands_with_redis(group: click.Group, path: str = "") -> set[str]:
    found: set[str] = set()
    for name, command in group.commands.items():
        full = f"{path} {name}".strip()
        if isinstance(command, click.Group):
            found |= commands_with_redis(command, full)
        elif any(p.name == "redis_url" for p in command.params):
            found.add(full)
    return found


async def test_a_bad_redis_url_scheme_on_every_command_that_takes_one(cluster: Cluster) -> None:
    assert commands_with_redis(cli) == set(REDIS_COMMANDS)  # a new one must be listed
    for name, args in REDIS_COMMANDS.items():
        result = await cluster.cli(*args, "--redis", BAD_REDIS)
        try:
            assert_one_error_line(result, "invalid Redis URL", "redis://")
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None
        assert result.returncode == 2, name
    # From the environment too.
    result = await cluster.cli("dlq", "ls", env={"STREAMWORKS_REDIS_URL": "localhost:6379"})
    assert_one_error_line(result, "invalid Redis URL")
    # A cluster's seed list: every URL is checked, and a password never printed.
    seeds = "redis://:s3cret@127.0.0.1:7000,127.0.0.1:7001"
    result = await cluster.cli("dlq", "ls", "--redis", seeds)
    assert_one_error_line(result, "invalid Redis URL '127.0.0.1:7001'")
    assert b"s3cret" not in result.stdout + result.stderr
    assert result.returncode == 2


async def test_bad_arguments_are_one_line(cluster: Cluster) -> None:
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    cases: list[tuple[list[str], tuple[str, ...]]] = [
        (["streams", "create", "bad name!", "--shards", "1"], ("invalid stream name",)),
        (["worker", INSTRUMENTED, "--log-level", "LOUD"], ("--log-level", "LOUD")),
        (["coordinator", "--log-format", "xml"], ("--log-format",)),
        (
            ["worker", "tests.e2e.apps.missing_dependency:app"],
            ("no_such_dependency_for_streamworks_tests", "not installed"),
        ),
        # Case-insensitive level: the error is about Redis, not the level.
        (
            ["worker", INSTRUMENTED, "--log-level", "debug", "--redis", "redis://127.0.0.1:1/0"],
            ("Redis",),
        ),
    ]
    for args, fragments in cases:
        result = await cluster.cli(*args)
        try:
            assert_one_error_line(result, *fragments)
        except AssertionError as e:
            raise AssertionError(f"{args}: {e}") from None
    missing_app = await cluster.cli("worker", "tests.e2e.apps.no_such_app:app")
    assert_one_error_line(missing_app, "cannot import module 'tests.e2e.apps.no_such_app'")


async def test_a_coordinator_port_in_use_is_one_line(cluster: Cluster) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = await cluster.cli("coordinator", "--host", "127.0.0.1", "--port", str(port))
    assert_one_error_line(result, f"127.0.0.1:{port}", "--port")
    assert result.returncode == 2


async def test_a_worker_says_where_and_why_its_coordinator_is_down(cluster: Cluster) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    worker = cluster.start("worker", "worker", INSTRUMENTED, "--coordinator", closed)

    async def warned_twice() -> bool:
        lines = [
            line
            for line in worker.output().splitlines()
            if "WARNING" in line and closed in line and "coordinator not ready" in line
        ]
        return len(lines) >= 2

    await wait_until(warned_twice, 20, "two warnings naming the coordinator URL")
    assert "connection" in worker.output().lower()  # why: the connection failed


async def test_log_format_json(cluster: Cluster, redis: Any) -> None:
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    worker = cluster.start_worker("worker", args=["--log-format", "json"])

    async def started() -> dict[str, Any] | None:
        for line in worker.output().splitlines():
            record = orjson.loads(line)  # every line is one JSON object
            if "started" in record["message"]:
                return dict(record)
        return None

    record = await wait_until(started, 20, "the worker's start record")
    assert record["level"] == "INFO" and record["logger"] == "streamworks.cli"
    assert record["group"] == "e2e" and re.fullmatch(r"[0-9a-f]{32}", record["member"])

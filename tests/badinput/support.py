"""Helpers of the bad-input tests: raw entries, dead letters by origin, child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from streamworks.protocol.shards import ShardId
from streamworks.testing import TestRuntime

REPO = Path(__file__).resolve().parents[2]


def entry(payload: bytes, **extra: bytes | str) -> list[bytes | str]:
    """A well-formed entry's fields around ``payload`` (as ``encode_fields`` writes
    them), with ``extra`` fields appended."""
    fields: list[bytes | str] = ["v", payload, "t", "1718000000000", "f", "1"]
    for name, value in extra.items():
        fields += [name, value]
    return fields


async def xadd_raw(rt: TestRuntime, stream: str, fields: Sequence[Any], index: int = 0) -> str:
    """Write an entry with exactly ``fields`` to shard ``index`` of ``stream`` (bypassing
    the producer, as a foreign or broken producer would); its entry id."""
    key = rt.keyspace.stream(ShardId(stream, index))
    entry_id = await rt.redis.execute_command("XADD", key, "*", *fields)
    return str(entry_id.decode() if isinstance(entry_id, bytes) else entry_id)


@dataclass(frozen=True)
class Dead:
    """One dead letter, read raw (``TestRuntime.dead_letters`` decodes field names as
    UTF-8, which fails for an entry whose original field names were binary)."""

    reason: str
    error: str
    attempts: int
    stream: str
    shard: str
    origin_id: str
    fields: dict[bytes, bytes]

    @property
    def original(self) -> dict[bytes, bytes]:
        """The original entry's fields (``o.<name>``), names without the prefix."""
        return {k[2:]: v for k, v in self.fields.items() if k.startswith(b"o.")}


async def dead_by_origin(rt: TestRuntime, stream: str) -> dict[str, Dead]:
    """The stream's dead letters keyed by the id of the entry they came from."""
    key = rt.keyspace.dead_letters(rt.app.name, stream)
    out: dict[str, Dead] = {}
    for _, fields in await rt.redis.xrange(key):
        dead = Dead(
            reason=fields[b"reason"].decode(),
            error=fields[b"error"].decode(),
            attempts=int(fields[b"attempts"]),
            stream=fields[b"stream"].decode(),
            shard=fields[b"shard"].decode(),
            origin_id=fields[b"entry_id"].decode(),
            fields=dict(fields),
        )
        assert dead.origin_id not in out, f"{dead.origin_id} was dead-lettered twice"
        out[dead.origin_id] = dead
    return out


async def pending_count(rt: TestRuntime, stream: str, group: str, index: int = 0) -> int:
    key = rt.keyspace.stream(ShardId(stream, index))
    return int((await rt.redis.xpending(key, group))["pending"])


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of a child process: ours without STREAMWORKS_*, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMWORKS_")}
    env.update({"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra})
    return env


def spawn(args: Sequence[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``python *args`` from the repository root, output to ``log``, in a session of
    its own (so it can be killed alone)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            env=dict(env),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


async def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The exit code of ``proc`` once it exits, or None if it still runs after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (code := proc.poll()) is None and time.monotonic() < deadline:  # noqa: ASYNC110
        await anyio.sleep(0.02)  # a child's exit has no event to wait on
    return code


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` (only this child, by its pid) if it still runs, and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)

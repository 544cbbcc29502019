"""``streamworks dlq`` — inspect, replay and purge dead-letter streams."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import click
import orjson
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from streamworks.cli.client import coordinator_client
from streamworks.cli.common import coordinator_options, make_settings, redis_options, run_async
from streamworks.protocol.codec import JsonCodec
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.runtime.leased_routing import LeasedRouting
from streamworks.runtime.producer import Producer, Record
from streamworks.settings import Settings

console = Console()


@click.group()
def dlq() -> None:
    """Dead-letter streams: one per group and stream."""


def _text(fields: dict[bytes, bytes], name: str) -> str:
    value = fields.get(name.encode())
    return value.decode(errors="replace") if value is not None else ""


@dlq.command("ls")
@redis_options
def ls(**flags: Any) -> None:
    """List dead-letter streams and their sizes."""

    async def run(settings: Settings) -> None:
        redis = create_redis(settings)
        try:
            pattern = f"{settings.key_prefix}:dlq:{{*}}"
            table = Table("group", "stream", "entries")
            async for key in redis.scan_iter(match=pattern, count=1000):
                inner = key.decode().split("{", 1)[1].rstrip("}")
                group, _, stream = inner.partition(":")
                table.add_row(group, stream, str(await redis.xlen(key)))
            console.print(table)
        finally:
            await redis.aclose()

    run_async(run)(make_settings(**flags))


@dlq.command("show")
@click.argument("group")
@click.argument("stream")
@click.option("--limit", type=int, default=20, show_default=True)
@redis_options
def show(group: str, stream: str, limit: int, **flags: Any) -> None:
    """Show dead-lettered messages of GROUP for STREAM."""

    async def run(settings: Settings) -> None:
        redis = create_redis(settings)
        try:
            key = Keyspace(settings.key_prefix).dead_letters(group, stream)
            table = Table("dlq id", "origin", "reason", "attempts", "error", "payload")
            for entry_id, fields in await redis.xrange(key, count=limit):
                table.add_row(
                    entry_id.decode(),
                    f"{_text(fields, 'shard')} {_text(fields, 'entry_id')}",
                    _text(fields, "reason"),
                    _text(fields, "attempts"),
                    _text(fields, "error")[:60],
                    _text(fields, "o.v")[:40],
                )
            console.print(table)
        finally:
            await redis.aclose()

    run_async(run)(make_settings(**flags))


@dlq.command("replay")
@click.argument("group")
@click.argument("stream")
@click.option("--limit", type=int, default=None, help="replay at most this many")
@redis_options
@coordinator_options
def replay(group: str, stream: str, limit: int | None, **flags: Any) -> None:
    """Re-publish dead letters through normal routing, then remove them from the DLQ.

    Entries without a payload, or whose key or headers cannot be read (poison), are
    kept in the DLQ and counted."""

    async def run(settings: Settings) -> None:
        redis = create_redis(settings)
        keyspace = Keyspace(settings.key_prefix)
        key = keyspace.dead_letters(group, stream)
        try:
            async with coordinator_client(settings) as client:
                routing = LeasedRouting(client)
                producer = Producer(redis, Scripts(redis), keyspace, routing, JsonCodec())
                total = await redis.xlen(key)
                if limit is not None:
                    total = min(total, limit)
                done = skipped = 0
                with Progress(console=console) as progress:
                    task = progress.add_task(f"replaying {group}/{stream}", total=total)
                    cursor = "-"
                    while done + skipped < total:
                        batch = await redis.xrange(key, min=cursor, count=100)
                        if not batch:
                            break
                        for entry_id, fields in batch:
                            if done + skipped >= total:
                                break
                            cursor = f"({entry_id.decode()}"
                            payload = fields.get(b"o.v")
                            if payload is None:
                                skipped += 1
                                continue
                            try:
                                record = Record(
                                    payload,
                                    key=_opt(fields, b"o.k"),
                                    event_id=_opt(fields, b"o.e"),
                                    headers=_headers(fields),
                                )
                                await producer.publish(stream, record)
                            except (ValueError, TypeError) as e:
                                # A poison entry (key, headers or size unusable) is
                                # kept in the DLQ and reported, not replayed.
                                console.print(f"[yellow]kept {entry_id.decode()}: {e}")
                                skipped += 1
                                continue
                            await redis.xdel(key, entry_id)  # the DLQ is not a shard
                            done += 1
                            progress.advance(task)
                        await anyio.lowlevel.checkpoint()
            console.print(f"replayed {done}, kept {skipped} (no payload, or unreadable)")
        finally:
            await redis.aclose()

    run_async(run)(make_settings(**flags))


def _opt(fields: dict[bytes, bytes], name: bytes) -> str | None:
    value = fields.get(name)
    return value.decode() if value is not None else None  # UnicodeDecodeError: ValueError


def _headers(fields: dict[bytes, bytes]) -> dict[str, str] | None:
    raw = fields.get(b"o.h")
    if raw is None:
        return None
    headers = orjson.loads(raw)  # orjson.JSONDecodeError is a ValueError
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ValueError("headers are not an object of strings")
    return headers


@dlq.command("purge")
@click.argument("group")
@click.argument("stream")
@click.option("--yes", is_flag=True, help="do not ask")
@redis_options
def purge(group: str, stream: str, yes: bool, **flags: Any) -> None:
    """Delete the dead-letter stream of GROUP for STREAM."""
    if not yes:
        click.confirm(f"delete every dead letter of {group}/{stream}?", abort=True)

    async def run(settings: Settings) -> None:
        redis = create_redis(settings)
        try:
            key = Keyspace(settings.key_prefix).dead_letters(group, stream)
            n = await redis.xlen(key)
            await redis.delete(key)
            console.print(f"purged {n} dead letters")
        finally:
            await redis.aclose()

    run_async(run)(make_settings(**flags))

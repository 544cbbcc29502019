"""``streamworks publish STREAM [VALUE]`` — publish from the shell, through routing.

The messages go through the runtime's :class:`~streamworks.runtime.producer.Producer`
with the coordinator's leased routing, exactly as an app publishes (jump hash by key,
fail-closed routing lease, re-routing after a scale-in, the namespace check that
refuses a Redis or key prefix the coordinator does not serve); never a raw ``XADD``.

Input: one JSON ``VALUE`` argument, or JSON lines from stdin (``-``) or ``--file``.
Lines are published in order, in batches; a line that is not JSON stops the command
with its line number, after everything before it was published and nothing after.
``--delay 30m`` / ``--at 2027-01-01T09:00:00+01:00`` delay every message published
(docs/delays.md).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import anyio
import click
import orjson
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from streamworks.cli.client import coordinator_client
from streamworks.cli.common import (
    coordinator_options,
    fail,
    make_settings,
    plural,
    redis_options,
    run_async,
)
from streamworks.cli.output import echo_json, make_console
from streamworks.delay import due_from
from streamworks.durations import parse_duration
from streamworks.exceptions import ConfigurationError, StreamworksError
from streamworks.protocol.codec import JsonCodec
from streamworks.protocol.shards import validate_name
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.namespace import NamespaceCheck
from streamworks.redis.scripts import Scripts
from streamworks.runtime.leased_routing import LeasedRouting
from streamworks.runtime.producer import Producer, Published, Record
from streamworks.settings import Settings

__all__ = ("publish",)

console = make_console()
err_console = make_console(stderr=True)

#: Lines parsed, then published in one round trip.
BATCH = 200


class _BadLine(Exception):
    def __init__(self, number: int, reason: str) -> None:
        super().__init__(reason)
        self.number = number
        self.reason = reason


def _header(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", ctx, param)
        headers[name] = value
    return headers


@click.command()
@click.argument("stream")
@click.argument("value", required=False)
@click.option("--key", help="partition key (messages with one key keep their order)")
@click.option("--event-id", help="the producer's event id (one message only)")
@click.option(
    "--header", "headers", multiple=True, callback=_header, metavar="NAME=VALUE",
    help="a string header (repeatable)",
)  # fmt: skip
@click.option(
    "--file", "path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON lines to publish, one message per line",
)  # fmt: skip
@click.option(
    "--records", is_flag=True,
    help='each line is {"value": ..., "key": ..., "event_id": ..., "headers": {...}}',
)  # fmt: skip
@click.option(
    "--delay", "delay_text", metavar="DURATION",
    help="deliver when due, this long from now (e.g. 30s, 5m, 1.5h, 2d)",
)  # fmt: skip
@click.option(
    "--at", "at_text", metavar="ISO8601",
    help="deliver when due at this instant, with its offset (2027-01-01T09:00:00+01:00)",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="one JSON line per published message")
@redis_options
@coordinator_options
def publish(
    stream: str,
    value: str | None,
    key: str | None,
    event_id: str | None,
    headers: dict[str, str],
    path: Path | None,
    records: bool,
    delay_text: str | None,
    at_text: str | None,
    as_json: bool,
    **flags: Any,
) -> None:
    """Publish to STREAM: a JSON VALUE, or JSON lines from stdin (VALUE "-") or --file.

    \b
      streamworks publish orders '{"id": 1, "amount": 5}' --key customer-7
      streamworks publish orders --file orders.jsonl --key customer-7
      cat orders.jsonl | streamworks publish orders - --json
      streamworks publish reminders '{"user": "u-1"}' --delay 30m
    """
    try:
        validate_name("stream", stream)
    except ConfigurationError as e:
        fail(str(e), 2)
    lines = path is not None or value == "-"
    if path is not None and value is not None:
        fail("give a VALUE or --file, not both", 2)
    if not lines and value is None:
        fail('nothing to publish: give a JSON VALUE, "-" for JSON lines on stdin, or --file', 2)
    if lines and event_id is not None:
        fail("--event-id names one message: give it per line with --records", 2)
    if records and not lines:
        fail("--records reads JSON lines (stdin or --file)", 2)
    timing = _timing(delay_text, at_text)
    single: Record | None = None
    if not lines:
        assert value is not None
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError as e:
            fail(f"VALUE is not JSON ({e}); a string needs quotes: '\"text\"'", 2)
        single = Record(parsed, key=key, event_id=event_id, headers=headers or None, **timing)
    settings = make_settings(**flags)

    async def run(settings: Settings) -> None:
        redis = create_redis(settings)
        try:
            async with coordinator_client(settings) as client:
                keyspace = Keyspace(settings.key_prefix)
                # The producer's namespace check: a publish to a Redis (or prefix) the
                # coordinator does not serve would be read by nobody.
                namespace = NamespaceCheck(redis, keyspace, settings.redis_url)
                producer = Producer(
                    redis,
                    Scripts(redis),
                    keyspace,
                    LeasedRouting(client, namespace=namespace),
                    JsonCodec(),
                    max_reroutes=settings.producer.max_reroutes,
                )
                if single is not None:
                    _report(await producer.publish(stream, single), as_json)
                    return
                if path is not None:
                    with path.open("rb") as source:
                        await _publish_lines(
                            producer, stream, source, key, headers, records, as_json, path, timing
                        )
                else:
                    await _publish_lines(
                        producer, stream, sys.stdin.buffer, key, headers, records, as_json, None,
                        timing,
                    )  # fmt: skip
        finally:
            await redis.aclose()

    run_async(run)(settings)


def _timing(delay_text: str | None, at_text: str | None) -> dict[str, Any]:
    """``delay``/``at`` of every record, from ``--delay``/``--at``; exits 2 on bad input."""
    if delay_text is not None and at_text is not None:
        fail("give --delay or --at, not both", 2)
    try:
        if delay_text is not None:
            if delay_text.strip().startswith("-"):
                fail(f"--delay {delay_text!r} is negative: a message cannot be due in the past", 2)
            delay: timedelta = parse_duration(delay_text, what="--delay")
            due_from(delay)
            return {"delay": delay}
        if at_text is not None:
            try:
                at = datetime.fromisoformat(at_text)
            except ValueError:
                fail(f"--at {at_text!r} is not an ISO 8601 time (2027-01-01T09:00:00+01:00)", 2)
            if at.tzinfo is None:
                fail(
                    f"--at {at_text!r} has no UTC offset: add one (e.g. +01:00 or Z), "
                    "or it would be read in this machine's local zone",
                    2,
                )
            due_from(at=at)
            return {"at": at}
    except ConfigurationError as e:
        fail(str(e), 2)
    return {}


def _report(result: Published, as_json: bool) -> None:
    if as_json:
        echo_json(asdict(result))
        return
    dup = " (duplicate: the event id was already published)" if result.duplicate else ""
    if result.delay_id is not None:
        console.print(
            f"delayed on [b]{result.shard}[/b] as {result.delay_id}, due at "
            f"{_due_text(result.due_ms)} (routing v{result.routing_version}){dup}",
            highlight=False,
        )
        return
    console.print(
        f"published to [b]{result.shard}[/b] as {result.entry_id} "
        f"(routing v{result.routing_version}){dup}",
        highlight=False,
    )


async def _publish_lines(
    producer: Producer,
    stream: str,
    source: IO[bytes],
    key: str | None,
    headers: dict[str, str],
    records: bool,
    as_json: bool,
    path: Path | None,
    timing: dict[str, Any],
) -> None:
    published = 0
    shards: Counter[str] = Counter()
    size = None if path is None else await anyio.Path(path).stat()
    progress = Progress(
        TextColumn(f"publishing to {stream}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("bytes"),
        TimeRemainingColumn(),
        console=err_console,
        disable=size is None or not err_console.is_terminal,
    )
    with progress:
        task = progress.add_task("publish", total=None if size is None else size.st_size)
        for batch, consumed, bad in _batches(source, key, headers, records):
            if batch and timing:
                batch = [replace(r, **timing) for r in batch]
            if batch:
                try:
                    results = await producer.publish_many(stream, batch)
                except (StreamworksError, TypeError, ValueError) as e:
                    done = plural(published, "message")
                    fail(f"{e}; {done} published before this batch, none after")
                published += len(results)
                for result in results:
                    shards[result.shard] += 1
                    if as_json:
                        echo_json(asdict(result))
            progress.update(task, advance=consumed)
            if bad is not None:
                where = f"{path}:" if path is not None else "stdin line "
                fail(
                    f"{where}{bad.number}: {bad.reason}; {plural(published, 'message')} published "
                    "before it, none after"
                )
    if not as_json:
        spread = ", ".join(f"{s}: {n}" for s, n in sorted(shards.items()))
        console.print(
            f"published {plural(published, 'message')} to {stream}"
            + (f" ({spread})" if spread else "")
        )


def _due_text(due_ms: int | None) -> str:
    if due_ms is None:
        return "?"
    return datetime.fromtimestamp(due_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _batches(
    source: IO[bytes], key: str | None, headers: dict[str, str], records: bool
) -> Iterator[tuple[list[Record], int, _BadLine | None]]:
    """``(records, bytes consumed, bad line or None)`` per batch; the batch holds the
    lines before a bad one, and nothing is read after it."""
    batch: list[Record] = []
    consumed = 0
    for number, raw in enumerate(source, start=1):
        consumed += len(raw)
        line = raw.strip()
        if not line:
            continue
        try:
            batch.append(_record(line, key, headers, records))
        except _BadLine as e:
            yield batch, consumed, _BadLine(number, e.reason)
            return
        if len(batch) >= BATCH:
            yield batch, consumed, None
            batch, consumed = [], 0
    yield batch, consumed, None


def _record(line: bytes, key: str | None, headers: dict[str, str], records: bool) -> Record:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise _BadLine(0, f"not JSON ({e})") from None
    if not records:
        return Record(value, key=key, headers=headers or None)
    if not isinstance(value, dict) or "value" not in value:
        raise _BadLine(0, 'not a record: {"value": ..., "key": ..., "headers": {...}}')
    unknown = set(value) - {"value", "key", "event_id", "headers"}
    if unknown:
        raise _BadLine(0, f"unknown record fields {sorted(unknown)}")
    line_key = value.get("key", key)
    event_id = value.get("event_id")
    extra = value.get("headers") or {}
    if not isinstance(extra, dict):
        raise _BadLine(0, "headers must be an object")
    line_headers = {**headers, **extra}
    if line_key is not None and not isinstance(line_key, str):
        raise _BadLine(0, "key must be a string")
    if event_id is not None and not isinstance(event_id, str):
        raise _BadLine(0, "event_id must be a string")
    if not all(isinstance(v, str) for v in line_headers.values()):
        raise _BadLine(0, "headers must map names to strings")
    return Record(value["value"], key=line_key, event_id=event_id, headers=line_headers or None)

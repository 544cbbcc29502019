"""``streamworks dlq`` — inspect, replay, delete and purge dead-letter streams.

A shell over :mod:`streamworks.dlq` (the library the dashboard calls too): every
command names one group and one stream (a dead-letter stream belongs to both); a
group or stream the namespace does not know is an error, not an empty table.
Entries are selected by DLQ id (one or many) and/or by filters (``--reason``,
``--error``, ``--older-than``, ``--newer-than``); ``replay`` sends them to the group's
redelivery path only, so other groups on the stream never see them again, after
checking that the coordinator serves this Redis and key prefix (the producer's
namespace check). ``--dry-run`` shows what would be done; ``delete`` and ``purge``
ask first (``--yes`` to skip; without a terminal, ``--yes`` is required).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

import click
import orjson
from rich.progress import Progress
from rich.table import Table

from streamworks.cli.client import coordinator_client
from streamworks.cli.common import (
    coordinator_options,
    fail,
    make_settings,
    plural,
    redis_options,
    run_async,
)
from streamworks.cli.output import confirm, echo_json, make_console
from streamworks.dlq import REASONS, DeadLetters, Selection, parse_age
from streamworks.exceptions import ConfigurationError
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.namespace import NamespaceCheck, where
from streamworks.settings import Settings

console = make_console()
F = TypeVar("F", bound=Callable[..., Any])


@click.group()
def dlq() -> None:
    """Dead-letter streams: one per group and stream."""


# -- options ------------------------------------------------------------------------------
class Age(click.ParamType[float, Any]):
    """A duration such as ``90s``, ``15m``, ``2h``, ``1d12h``, ``1w``."""

    name = "age"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float | int):
            return float(value)
        try:
            return parse_age(str(value))
        except ConfigurationError as e:
            self.fail(str(e), param, ctx)


def selection_options(fn: F) -> F:
    """IDS... plus the filters; the command receives one ``selection``."""
    fn = click.option(
        "--newer-than", type=Age(), help="only entries dead-lettered less than AGE ago"
    )(fn)
    fn = click.option(
        "--older-than", type=Age(), help="only entries dead-lettered more than AGE ago (e.g. 2h)"
    )(fn)
    fn = click.option("--error", "error_text", help="only entries whose error contains TEXT")(fn)
    fn = click.option(
        "--reason",
        "reasons",
        multiple=True,
        type=click.Choice(REASONS),
        help="only entries dead-lettered for this reason (repeatable)",
    )(fn)
    return click.argument("ids", nargs=-1, metavar="[DLQ_ID]...")(fn)


def _selection(
    ids: tuple[str, ...],
    reasons: tuple[str, ...],
    error_text: str | None,
    older_than: float | None,
    newer_than: float | None,
    *,
    limit: int | None = None,
) -> Selection:
    try:
        return Selection.of(ids, reasons, error_text, older_than, newer_than, limit)
    except ConfigurationError as e:
        fail(str(e), 2)
        raise  # unreachable


def _library(settings: Settings, redis: Any, client: Any = None) -> DeadLetters:
    keyspace = Keyspace(settings.key_prefix)
    return DeadLetters(
        redis,
        keyspace,
        routing=client,
        namespace=NamespaceCheck(redis, keyspace, settings.redis_url),
        where=where(client) if client is not None else "",
    )


def _age(ms: int) -> str:
    seconds = max(0, int(time.time() - ms / 1000))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


# -- commands -----------------------------------------------------------------------------
@dlq.command("ls")
@click.option("--group", "only_group", help="only this group's dead-letter streams")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@redis_options
def ls(only_group: str | None, as_json: bool, **flags: Any) -> None:
    """List dead-letter streams and their sizes."""

    async def run(settings: Settings) -> None:
        redis = create_redis(settings)
        try:
            found = await _library(settings, redis).streams(only_group)
            rows = [asdict(r) for r in found]
            if as_json:
                echo_json({"dead_letter_streams": rows})
                return
            if not rows:
                console.print(f"no dead letters in namespace {settings.key_prefix!r}")
                return
            table = Table("group", "stream", "entries", "oldest")
            for r in rows:
                oldest_age = _age(r["oldest_ms"]) if r["oldest_ms"] is not None else "-"
                table.add_row(r["group"], r["stream"], str(r["entries"]), oldest_age)
            console.print(table)
        finally:
            await redis.aclose()

    run_async(run)(make_settings(**flags))


@dlq.command("show")
@click.argument("group")
@click.argument("stream")
@selection_options
@click.option("--limit", type=click.IntRange(1), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@redis_options
def show(
    group: str, stream: str, limit: int, as_json: bool, ids: tuple[str, ...], **flags: Any
) -> None:
    """Show dead letters of GROUP for STREAM: a table, or one entry in full (one DLQ_ID)."""
    selection = _selection(ids, *_pop_filters(flags), limit=limit)

    async def run(settings: Settings) -> None:
        redis = create_redis(settings)
        try:
            library = _library(settings, redis)
            entries = [e.as_json() for e in await library.select(group, stream, selection)]
            total = await library.total(group, stream)
        finally:
            await redis.aclose()
        if as_json:
            echo_json({"group": group, "stream": stream, "total": total, "entries": entries})
            return
        if not entries:
            console.print(f"no dead letters of {group}/{stream} match ({total} in all)")
            return
        if len(ids) == 1:
            _print_entry(entries[0])
            return
        table = Table("dlq id", "age", "origin", "reason", "attempts", "key", "error", "payload")
        for e in entries:
            error = (e["error"].splitlines() or [""])[0]
            table.add_row(
                e["id"],
                _age(e["failed_at_ms"]),
                f"{e['shard'] or ''} {e['entry_id'] or ''}".strip(),
                e["reason"],
                str(e["attempts"]),
                e["key"] or "",
                error[:100],
                (e["payload"] or "")[:60],
            )
        console.print(table)
        if total > len(entries):
            console.print(f"{len(entries)} shown of {total} (--limit, filters)")

    run_async(run)(make_settings(**flags))


def _print_entry(entry: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for name in ("id", "reason", "attempts", "group", "stream", "shard", "entry_id", "member"):
        table.add_row(name, str(entry[name]))
    table.add_row("age", _age(entry["failed_at_ms"]))
    for name in ("key", "event_id", "headers", "payload", "error"):
        if entry[name] is not None:
            value = entry[name]
            table.add_row(name, value if isinstance(value, str) else orjson.dumps(value).decode())
    console.print(table)
    if entry["traceback"]:
        console.print("[bold]traceback[/bold]")
        console.print(entry["traceback"], markup=False, highlight=False)


def _pop_filters(flags: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(flags.pop(n) for n in ("reasons", "error_text", "older_than", "newer_than"))


@dlq.command("replay")
@click.argument("group")
@click.argument("stream")
@selection_options
@click.option("--limit", type=click.IntRange(1), default=None, help="replay at most this many")
@click.option("--dry-run", is_flag=True, help="show what would be replayed, and where")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@redis_options
@coordinator_options
def replay(
    group: str,
    stream: str,
    limit: int | None,
    dry_run: bool,
    as_json: bool,
    ids: tuple[str, ...],
    **flags: Any,
) -> None:
    """Hand dead letters back to GROUP only, then remove them from the DLQ.

    Each goes to GROUP's redelivery stream of the shard its key routes to now (the
    origin shard for unkeyed ones while it is routable); the shard's owner in GROUP
    handles it with the same handler, in its key's order. Other groups on STREAM never
    see it. Entries without a payload, or whose key or headers cannot be read, are
    kept in the DLQ and counted.
    """
    selection = _selection(ids, *_pop_filters(flags), limit=limit)

    async def run(settings: Settings) -> None:
        redis = create_redis(settings)
        try:
            async with coordinator_client(settings) as client:
                library = _library(settings, redis, client)
                show_progress = not as_json and console.is_terminal and not dry_run
                with Progress(console=console, disable=not show_progress) as progress:
                    task = progress.add_task(f"replaying {group}/{stream}", total=None)
                    result = await library.replay(
                        group,
                        stream,
                        selection,
                        dry_run=dry_run,
                        on_entry=lambda: progress.advance(task),
                    )
        finally:
            await redis.aclose()
        if as_json:
            echo_json(asdict(result))
            return
        for kept in result.kept:
            console.print(f"[yellow]kept {kept.id}: {kept.why}", highlight=False)
        if dry_run:
            for r in result.replayed:
                console.print(f"would replay {r.id} to {group} on {r.shard}", highlight=False)
            console.print(
                f"dry run: would replay {len(result.replayed)}, keep {len(result.kept)} "
                "(no payload, or unreadable); nothing was changed",
                highlight=False,
            )
        else:
            console.print(
                f"replayed {len(result.replayed)} to group {group} only (removed from the "
                f"DLQ), kept {len(result.kept)} (no payload, or unreadable)",
                highlight=False,
            )

    run_async(run)(make_settings(**flags))


@dlq.command("delete")
@click.argument("group")
@click.argument("stream")
@selection_options
@click.option("--dry-run", is_flag=True, help="show what would be deleted")
@click.option("--yes", is_flag=True, help="do not ask")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@redis_options
def delete(
    group: str,
    stream: str,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    ids: tuple[str, ...],
    **flags: Any,
) -> None:
    """Delete selected dead letters of GROUP for STREAM (by DLQ_ID and/or filters)."""
    selection = _selection(ids, *_pop_filters(flags))
    if not selection.narrowed:
        fail("select entries by DLQ_ID or a filter (to delete them all: dlq purge)", 2)
    _remove(group, stream, selection, dry_run, yes, as_json, flags, purge=False)


@dlq.command("purge")
@click.argument("group")
@click.argument("stream")
@click.option("--dry-run", is_flag=True, help="show how many would be deleted")
@click.option("--yes", is_flag=True, help="do not ask")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@redis_options
def purge(group: str, stream: str, dry_run: bool, yes: bool, as_json: bool, **flags: Any) -> None:
    """Delete every dead letter of GROUP for STREAM."""
    _remove(group, stream, Selection(), dry_run, yes, as_json, flags, purge=True)


def _remove(
    group: str,
    stream: str,
    selection: Selection,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    flags: dict[str, Any],
    *,
    purge: bool,
) -> None:
    async def run(settings: Settings) -> None:
        redis = create_redis(settings)
        try:
            library = _library(settings, redis)
            # What would go first, then the question, then the same call for real.
            if purge:
                ids: list[str] = []
                count = await library.purge(group, stream, dry_run=True)
            else:
                ids = await library.delete(group, stream, selection, dry_run=True)
                count = len(ids)
            if not dry_run and count:
                what = "every dead letter" if purge else plural(count, "dead letter")
                confirm(
                    f"delete {what} of {group}/{stream} ({count})?",
                    yes=yes,
                    refused="to delete (or --dry-run to look first)",
                )
                if purge:
                    count = await library.purge(group, stream)
                else:
                    for_ids = Selection.of(ids=ids)
                    ids = await library.delete(group, stream, for_ids)
                    count = len(ids)
        finally:
            await redis.aclose()
        verb = "would delete" if dry_run else ("purged" if purge else "deleted")
        if as_json:
            echo_json(
                {
                    "group": group,
                    "stream": stream,
                    "dry_run": dry_run,
                    "deleted": count,
                    "ids": ids,
                }
            )
        else:
            console.print(f"{verb} {plural(count, 'dead letter')}")

    run_async(run)(make_settings(**flags))

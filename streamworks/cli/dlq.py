"""``streamworks dlq`` — inspect, replay, delete and purge dead-letter streams.

Every command names one group and one stream (a dead-letter stream belongs to both);
a group or stream the namespace does not know is an error, not an empty table.
Entries are selected by DLQ id (one or many) and/or by filters (``--reason``,
``--error``, ``--older-than``, ``--newer-than``); ``replay`` sends them to the group's
redelivery path only (``streamworks.runtime.redelivery``), so other groups on the
stream never see them again. ``--dry-run`` shows what would be done; ``delete`` and
``purge`` ask first (``--yes`` to skip; without a terminal, ``--yes`` is required).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio.lowlevel
import click
import orjson
from rich.progress import Progress
from rich.table import Table

from streamworks.cli.client import coordinator_client
from streamworks.cli.common import (
    coordinator_options,
    fail,
    make_settings,
    redis_options,
    run_async,
)
from streamworks.cli.output import echo_json, make_console, stdin_is_terminal
from streamworks.exceptions import ConfigurationError, StreamworksError
from streamworks.protocol.shards import validate_name
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.runtime.leased_routing import LeasedRouting
from streamworks.runtime.redelivery import original_key, redeliver, target_shard
from streamworks.settings import Settings

console = make_console()
F = TypeVar("F", bound=Callable[..., Any])

#: A dead-letter stream's entry id: ``<ms>-<seq>``.
_ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
_AGE_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


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
        text = str(value).strip().lower()
        parts = _AGE_PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            self.fail(f"{value!r} is not an age: use e.g. 90s, 15m, 2h, 1d12h, 1w", param, ctx)
        return sum(float(n) * _UNIT[u] for n, u in parts)


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters a command acts on: ids and/or filters (all must match)."""

    ids: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    error: str | None = None
    older_than: float | None = None
    newer_than: float | None = None
    limit: int | None = None

    @property
    def narrowed(self) -> bool:
        """Whether anything narrows the selection (else it is every entry)."""
        return bool(
            self.ids or self.reasons or self.error is not None
            or self.older_than is not None or self.newer_than is not None
        )  # fmt: skip

    def matches(self, fields: dict[bytes, bytes]) -> bool:
        if self.reasons and _text(fields, "reason") not in self.reasons:
            return False
        return self.error is None or self.error.lower() in _text(fields, "error").lower()


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
        type=click.Choice(["max_attempts", "poison", "crashed"]),
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
    for entry_id in ids:
        if not _ENTRY_ID.fullmatch(entry_id):
            fail(f"{entry_id!r} is not a dead-letter id (like 1718000000000-0; see dlq show)", 2)
    if older_than is not None and newer_than is not None and newer_than <= older_than:
        fail("--newer-than must be longer ago than --older-than: nothing can match", 2)
    return Selection(ids, reasons, error_text, older_than, newer_than, limit)


def _text(fields: dict[bytes, bytes], name: str) -> str:
    value = fields.get(name.encode())
    return value.decode(errors="replace") if value is not None else ""


# -- target and selection -------------------------------------------------------------------
async def _dead_letter_key(redis: Any, settings: Settings, group: str, stream: str) -> str:
    """The group's dead-letter stream for ``stream``; exit 2 when the namespace does not
    know the group or the stream (a typo would otherwise look like an empty DLQ)."""
    try:
        validate_name("group", group)
        validate_name("stream", stream)
    except ConfigurationError as e:
        fail(str(e), 2)
    keyspace = Keyspace(settings.key_prefix)
    key = keyspace.dead_letters(group, stream)
    if await redis.exists(key):
        return key  # dead letters exist: whatever the registry says, they are real
    where = f"in namespace {settings.key_prefix!r}"
    if not await redis.sismember(keyspace.registry_streams(), stream):
        fail(f"unknown stream {stream!r} {where} (see streamworks streams ls)", 2)
    if not await redis.sismember(keyspace.registry_groups(), group):
        fail(f"unknown group {group!r} {where} (see streamworks status)", 2)
    if not await redis.sismember(keyspace.registry_subscriptions(stream), group):
        fail(f"group {group!r} does not consume stream {stream!r} {where}", 2)
    return key


async def _select(
    redis: Any, key: str, selection: Selection
) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The selected entries, oldest first (an id that is not there is an error)."""
    out: list[tuple[bytes, dict[bytes, bytes]]] = []
    now_ms = int(time.time() * 1000)
    low = "-" if selection.newer_than is None else str(now_ms - int(selection.newer_than * 1000))
    high = "+" if selection.older_than is None else str(now_ms - int(selection.older_than * 1000))
    if selection.ids:
        missing = []
        for entry_id in dict.fromkeys(selection.ids):
            found = await redis.xrange(key, min=entry_id, max=entry_id)
            if not found:
                missing.append(entry_id)
                continue
            rid, fields = found[0]
            in_age = (low == "-" or _ms(rid) >= int(low)) and (high == "+" or _ms(rid) <= int(high))
            if in_age and selection.matches(fields):
                out.append((rid, fields))
        if missing:
            fail(f"no dead letter {', '.join(missing)} in {key} (nothing was done)", 2)
        out.sort(key=lambda e: tuple(int(p) for p in e[0].split(b"-")))
        return out[: selection.limit] if selection.limit is not None else out
    cursor = low
    while selection.limit is None or len(out) < selection.limit:
        batch = await redis.xrange(key, min=cursor, max=high, count=500)
        if not batch:
            break
        for rid, fields in batch:
            if selection.matches(fields):
                out.append((rid, fields))
                if selection.limit is not None and len(out) >= selection.limit:
                    break
        cursor = f"({batch[-1][0].decode()}"
        await anyio.lowlevel.checkpoint()
    return out


def _ms(entry_id: bytes) -> int:
    return int(entry_id.split(b"-", 1)[0])


def _describe(entry_id: bytes, fields: dict[bytes, bytes]) -> dict[str, Any]:
    """One dead letter as JSON-ready data (the ``--json`` schema of an entry)."""
    headers: Any = None
    raw_headers = fields.get(b"o.h")
    if raw_headers is not None:
        try:
            headers = orjson.loads(raw_headers)
        except orjson.JSONDecodeError:
            headers = raw_headers.decode(errors="replace")
    payload = fields.get(b"o.v")
    failed_at = _text(fields, "failed_at")
    return {
        "id": entry_id.decode(),
        "reason": _text(fields, "reason"),
        "error": _text(fields, "error"),
        "traceback": _text(fields, "traceback") or None,
        "attempts": int(_text(fields, "attempts") or 0),
        "group": _text(fields, "group") or None,
        "stream": _text(fields, "stream") or None,
        "shard": _text(fields, "shard") or None,
        "entry_id": _text(fields, "entry_id") or None,
        "member": _text(fields, "member") or None,
        "failed_at_ms": int(failed_at) if failed_at.isdigit() else _ms(entry_id),
        "key": _text(fields, "o.k") if b"o.k" in fields else None,
        "event_id": _text(fields, "o.e") if b"o.e" in fields else None,
        "headers": headers,
        "payload": payload.decode(errors="replace") if payload is not None else None,
    }


def _age(ms: int) -> str:
    seconds = max(0, int(time.time() - ms / 1000))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not stdin_is_terminal():
        fail("no terminal to confirm on: pass --yes to delete (or --dry-run to look first)", 2)
    if not click.confirm(question, default=False):
        fail("aborted: nothing was deleted")


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
            rows: list[dict[str, Any]] = []
            keyspace = Keyspace(settings.key_prefix)
            pattern = keyspace.dead_letters_pattern()
            async for key in redis.scan_iter(match=pattern, count=1000):
                try:
                    group, stream = keyspace.dead_letters_of(key.decode())
                except ValueError:
                    continue  # not a dead-letter stream (a longer prefix sharing ours)
                if only_group is not None and group != only_group:
                    continue
                length = int(await redis.xlen(key))
                oldest = await redis.xrange(key, count=1)
                rows.append(
                    {
                        "group": group,
                        "stream": stream,
                        "entries": length,
                        "oldest_ms": _ms(oldest[0][0]) if oldest else None,
                    }
                )
            rows.sort(key=lambda r: (r["group"], r["stream"]))
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
            key = await _dead_letter_key(redis, settings, group, stream)
            entries = [_describe(i, f) for i, f in await _select(redis, key, selection)]
            total = int(await redis.xlen(key))
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
        keyspace = Keyspace(settings.key_prefix)
        try:
            key = await _dead_letter_key(redis, settings, group, stream)
            entries = await _select(redis, key, selection)
            replayed: list[dict[str, Any]] = []
            kept: list[dict[str, str]] = []
            async with coordinator_client(settings) as client:
                routing = LeasedRouting(client)
                scripts = Scripts(redis)
                show_progress = not as_json and console.is_terminal and not dry_run
                with Progress(console=console, disable=not show_progress) as progress:
                    task = progress.add_task(f"replaying {group}/{stream}", total=len(entries))
                    for entry_id, fields in entries:
                        dlq_id = entry_id.decode()
                        try:
                            if dry_run:
                                shard = await _dry_target(routing, stream, fields)
                                replayed.append({"id": dlq_id, "shard": shard})
                                continue
                            done = await redeliver(
                                redis, scripts, keyspace, routing, group, stream, fields
                            )
                        except (ValueError, TypeError) as e:
                            # A poison entry (no payload, key unreadable) is kept in the
                            # DLQ and reported, not replayed.
                            kept.append({"id": dlq_id, "why": str(e)})
                            if not as_json:
                                console.print(f"[yellow]kept {dlq_id}: {e}")
                            continue
                        except StreamworksError as e:  # no routing, Redis down, ...
                            fail(
                                f"{e}; {len(replayed)} replayed before {dlq_id} (removed from "
                                "the DLQ), the rest are still in it"
                            )
                        await redis.xdel(key, entry_id)
                        replayed.append(
                            {"id": dlq_id, "shard": done.shard, "redelivery_id": done.entry_id}
                        )
                        progress.advance(task)
        finally:
            await redis.aclose()
        if as_json:
            echo_json(
                {
                    "group": group,
                    "stream": stream,
                    "dry_run": dry_run,
                    "replayed": replayed,
                    "kept": kept,
                }
            )
        elif dry_run:
            for r in replayed:
                console.print(f"would replay {r['id']} to {group} on {r['shard']}")
            console.print(f"dry run: would replay {len(replayed)}, keep {len(kept)}")
        else:
            console.print(
                f"replayed {len(replayed)}, kept {len(kept)} (no payload, or unreadable) "
                f"to group {group} only"
            )

    run_async(run)(make_settings(**flags))


async def _dry_target(routing: LeasedRouting, stream: str, fields: dict[bytes, bytes]) -> str:
    if b"o.v" not in fields:
        raise ValueError("no original payload")
    key = original_key(fields)
    table = await routing.routing(stream)
    return str(target_shard(table, key, _text(fields, "shard")))


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
            key = await _dead_letter_key(redis, settings, group, stream)
            if purge:
                ids = []
                count = int(await redis.xlen(key))
            else:
                ids = [i for i, _ in await _select(redis, key, selection)]
                count = len(ids)
            if not dry_run and count:
                what = "every dead letter" if purge else f"{count} dead letters"
                _confirm(f"delete {what} of {group}/{stream} ({count})?", yes)
                if purge:
                    await redis.delete(key)
                else:
                    for i in range(0, len(ids), 500):
                        await redis.xdel(key, *ids[i : i + 500])
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
                    "ids": [i.decode() for i in ids],
                }
            )
        else:
            console.print(f"{verb} {count} dead letters")

    run_async(run)(make_settings(**flags))

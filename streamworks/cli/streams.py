"""``streamworks streams`` — topology administration through the coordinator."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import anyio
import click
from rich.live import Live
from rich.table import Table

from streamworks.cli.client import coordinator_client
from streamworks.cli.common import (
    EXIT_USAGE,
    coordinator_options,
    fail,
    make_settings,
    plural,
    run_async,
)
from streamworks.cli.output import confirm, make_console
from streamworks.cli.render import fence_left, stream_table
from streamworks.exceptions import ConfigurationError
from streamworks.protocol.shards import validate_name
from streamworks.settings import Settings

console = make_console()


@click.group()
def streams() -> None:
    """Create, list, show and scale streams."""


@streams.command("create")
@click.argument("name")
@click.option("--shards", type=click.IntRange(0, 4096), required=True)
@coordinator_options
def create(name: str, shards: int, **flags: Any) -> None:
    """Create stream NAME with a number of shards (admin token)."""
    _check_name(name)

    async def run(settings: Settings) -> None:
        async with coordinator_client(settings) as client:
            info = await client.create_stream(name, shards)
        verb = "created" if info.created else "exists:"
        console.print(f"{verb} stream [b]{info.name}[/b] with {plural(info.shard_count, 'shard')}")

    run_async(run)(make_settings(**flags))


def _check_name(name: str) -> None:
    try:
        validate_name("stream", name)
    except ConfigurationError as e:
        fail(str(e), 2)


@streams.command("ls")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@coordinator_options
def ls(as_json: bool, **flags: Any) -> None:
    """List streams."""

    async def run(settings: Settings) -> None:
        async with coordinator_client(settings) as client:
            status = await client.status()
        if as_json:
            click.echo(status.model_dump_json(by_alias=True, include={"streams"}))
            return
        if not status.streams:
            console.print(f"no streams yet at {', '.join(settings.coordinator_urls)}")
        for s in status.streams:
            states: dict[str, int] = {}
            for shard in s.shards:
                states[shard.state] = states.get(shard.state, 0) + 1
            summary = ", ".join(f"{n} {state.lower()}" for state, n in sorted(states.items()))
            phase = (s.migration or {}).get("phase", "NONE")
            migration = f"  migration {phase}" if phase != "NONE" else ""
            count = plural(s.shard_count, "shard")
            console.print(f"{s.name:30s} {count:>12s} ({summary}){migration}")

    run_async(run)(make_settings(**flags))


@streams.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@coordinator_options
def show(name: str, as_json: bool, **flags: Any) -> None:
    """Show a stream's shards with each group's pending and lag."""

    async def run(settings: Settings) -> None:
        async with coordinator_client(settings) as client:
            status = await client.status()
        matches = [s for s in status.streams if s.name == name]
        if not matches:
            fail(f"unknown stream {name!r} (see streamworks streams ls)", EXIT_USAGE)
        if as_json:
            click.echo(matches[0].model_dump_json(by_alias=True))
        else:
            console.print(stream_table(matches[0]))

    run_async(run)(make_settings(**flags))


@streams.command("scale")
@click.argument("name")
@click.option("--shards", type=click.IntRange(0, 4096), required=True)
@click.option("--wait", is_flag=True, help="follow the migration until it completes")
@click.option("--timeout", type=float, default=None, help="give up waiting after this long (s)")
@click.option("--yes", is_flag=True, help="do not ask (scaling to 0 shards asks first)")
@coordinator_options
def scale(
    name: str, shards: int, wait: bool, timeout: float | None, yes: bool, **flags: Any
) -> None:
    """Change a stream's shard count live (admin token).

    Scale-out is immediate. Scale-in marks the removed shards DRAINING: producers stop
    routing to them at once, workers read them to the end, and each is retired when
    Redis shows every group drained it. With --wait, the progress is shown until then.
    Scaling to 0 shards asks first (--yes to skip): every publish then fails.
    """
    _check_name(name)
    if shards == 0:
        confirm(
            f"scale stream {name!r} to 0 shards? Every publish to it fails until it is "
            "scaled out again",
            yes=yes,
            refused="to scale to 0 shards",
        )

    async def run(settings: Settings) -> None:
        async with coordinator_client(settings) as client:
            info = await client.scale_stream(name, shards)
            draining = [s for s in info.shards if s.state == "DRAINING"]
            console.print(
                f"stream [b]{name}[/b]: routing now has {plural(info.shard_count, 'shard')} "
                f"(routing v{info.routing_version}); draining: {plural(len(draining), 'shard')}"
            )
            if not wait:
                return
            await _follow(client, name, timeout)

    run_async(run)(make_settings(**flags))


async def _follow(client: Any, name: str, timeout: float | None) -> None:
    """Show the migration's progress until no shard of ``name`` is draining: a live
    table on a terminal; when piped, one line per change, then the final table."""
    started = anyio.current_time()
    live = Live(console=console, refresh_per_second=4) if console.is_terminal else None
    last_line = ""
    stream: Any = None
    with live if live is not None else contextlib.nullcontext():
        while True:
            status = await client.status()
            stream = next((s for s in status.streams if s.name == name), None)
            if stream is None:
                fail(f"unknown stream {name!r} (see streamworks streams ls)", EXIT_USAGE)
                return
            draining = [s for s in stream.shards if s.state == "DRAINING"]
            elapsed = anyio.current_time() - started
            if live is not None:
                live.update(_progress_view(stream, draining, elapsed))
            else:
                line = _progress_line(stream, draining)
                if line != last_line:
                    console.print(f"{elapsed:5.0f}s  {line}", highlight=False)
                    last_line = line
            if not draining:
                break
            if timeout is not None and elapsed > timeout:
                if live is None:
                    console.print(_progress_view(stream, draining, elapsed))
                fail(f"{name}: still draining after {timeout:.0f}s (see the table above)")
            await anyio.sleep(0.5)
    console.print(f"[green]migration of {name} complete[/] ({plural(stream.shard_count, 'shard')})")


def _progress_line(stream: Any, draining: list[Any]) -> str:
    """The migration's state in a line that changes only when something happens
    (the fence countdown in 5 s steps)."""
    if not draining:
        return "drained: no shard left to retire"
    migration = stream.migration or {}
    phase = migration.get("phase", "NONE")
    if phase == "FENCING":
        left = fence_left(migration)
        step = f"{5 * math.ceil(left / 5):.0f}s" if left is not None else "?"
        return f"FENCING: routing fence in ~{step}; {plural(len(draining), 'shard')} draining"
    waiting = migration.get("blocked") or {}
    return f"{phase}: {plural(len(draining), 'shard')} draining, {len(waiting)} waiting"


def _progress_view(stream: Any, draining: list[Any], elapsed: float) -> Table:
    migration = stream.migration or {}
    phase = migration.get("phase", "NONE")
    fence = ""
    if phase == "FENCING":
        left = fence_left(migration)
        if left is not None:
            # The shards stay unchecked until no producer can hold the old routing.
            fence = f", routing fence in {left:.0f}s (drain checks start then)"
    table = Table(
        title=(
            f"{stream.name}: phase {phase}{fence}, {plural(len(draining), 'shard')} draining, "
            f"{elapsed:.0f}s"
        ),
        title_justify="left",
    )
    table.add_column("draining shard")
    table.add_column("group")
    table.add_column("pending", justify="right")
    table.add_column("lag", justify="right")
    table.add_column("waiting for")
    blocked = migration.get("blocked", {})
    for shard in draining:
        groups = shard.groups or []
        if not groups:
            table.add_row(shard.shard, "-", "-", "-", blocked.get(shard.shard, ""))
        for i, g in enumerate(groups):
            lag = "[red]nil (not provable)[/red]" if g.lag is None else str(g.lag)
            table.add_row(
                shard.shard if i == 0 else "",
                g.group,
                str(g.pending),
                lag,
                blocked.get(shard.shard, "") if i == 0 else "",
            )
    return table

"""``streamworks streams`` — topology administration through the coordinator."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from streamworks.cli.client import coordinator_client
from streamworks.cli.common import coordinator_options, make_settings, run_async
from streamworks.cli.render import stream_table
from streamworks.settings import Settings

console = Console()


@click.group()
def streams() -> None:
    """Create, list, show and scale streams."""


@streams.command("create")
@click.argument("name")
@click.option("--shards", type=click.IntRange(0, 4096), required=True)
@coordinator_options
def create(name: str, shards: int, **flags: Any) -> None:
    """Create stream NAME with a number of shards (admin token)."""

    async def run(settings: Settings) -> None:
        async with coordinator_client(settings) as client:
            info = await client.create_stream(name, shards)
        verb = "created" if info.created else "exists:"
        console.print(f"{verb} stream [b]{info.name}[/b] with {info.shard_count} shards")

    run_async(run)(make_settings(**flags))


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
        for s in status.streams:
            states: dict[str, int] = {}
            for shard in s.shards:
                states[shard.state] = states.get(shard.state, 0) + 1
            summary = ", ".join(f"{n} {state.lower()}" for state, n in sorted(states.items()))
            migration = f"  migration {s.migration.get('phase')}" if s.migration else ""
            console.print(f"{s.name:30s} {s.shard_count:5d} shards ({summary}){migration}")

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
            raise click.ClickException(f"unknown stream {name!r}")
        if as_json:
            click.echo(matches[0].model_dump_json(by_alias=True))
        else:
            console.print(stream_table(matches[0]))

    run_async(run)(make_settings(**flags))


@streams.command("scale")
@click.argument("name")
@click.option("--shards", type=click.IntRange(0, 4096), required=True)
@coordinator_options
def scale(name: str, shards: int, **flags: Any) -> None:
    """Change a stream's shard count live (admin token)."""

    async def run(settings: Settings) -> None:
        async with coordinator_client(settings) as client:
            info = await client.scale_stream(name, shards)
        console.print(f"stream [b]{info.name}[/b]: scaling to {shards} shards: {info.migration}")

    run_async(run)(make_settings(**flags))

"""``streamworks admin`` — operator actions, e.g. recovery after metadata loss (E21)."""

from __future__ import annotations

from typing import Any

import click

from streamworks.cli.client import coordinator_client
from streamworks.cli.common import coordinator_options, make_settings, run_async
from streamworks.protocol.control import ReinitializeRequest
from streamworks.settings import Settings


@click.group()
def admin() -> None:
    """Operator actions (admin token)."""


@admin.group()
def reinit() -> None:
    """Re-create lost metadata of a stream or group (fail-closed recovery, E21)."""


@reinit.command("stream")
@click.argument("name")
@click.option("--shards", type=click.IntRange(0, 4096), required=True, help="shard count to create")
@click.option("--yes", is_flag=True, help="do not ask")
@coordinator_options
def reinit_stream(name: str, shards: int, yes: bool, **flags: Any) -> None:
    """Re-initialise stream NAME: new shards are created; shard keys still in Redis are
    adopted as DRAINING so their entries are consumed before they are retired."""
    if not yes:
        click.confirm(f"re-initialise the metadata of stream {name!r}?", abort=True)
    _reinit(ReinitializeRequest(kind="stream", name=name, shards=shards, confirm=True), flags)


@reinit.command("group")
@click.argument("name")
@click.option("--yes", is_flag=True, help="do not ask")
@coordinator_options
def reinit_group(name: str, yes: bool, **flags: Any) -> None:
    """Re-initialise group NAME: empty metadata, epochs above every owner fence;
    its members rejoin on their next heartbeat."""
    if not yes:
        click.confirm(f"re-initialise the metadata of group {name!r}?", abort=True)
    _reinit(ReinitializeRequest(kind="group", name=name, confirm=True), flags)


def _reinit(request: ReinitializeRequest, flags: dict[str, Any]) -> None:
    async def run(settings: Settings) -> None:
        async with coordinator_client(settings) as client:
            await client.reinitialize(request)
        click.echo(f"re-initialised {request.kind} {request.name}")

    run_async(run)(make_settings(**flags))

"""``streamworks status`` — groups, members, epochs, assignments, lag per shard."""

from __future__ import annotations

from typing import Any

import anyio
import click
from rich.console import Console
from rich.live import Live

from streamworks.cli.client import coordinator_client
from streamworks.cli.common import coordinator_options, make_settings, run_async
from streamworks.cli.render import status_view
from streamworks.settings import Settings

console = Console()


@click.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--watch", is_flag=True, help="refresh every second until Ctrl-C")
@coordinator_options
def status(as_json: bool, watch: bool, **flags: Any) -> None:
    """Show streams (shards, pending, lag) and groups (members, epochs, assignments)."""

    async def run(settings: Settings) -> None:
        async with coordinator_client(settings) as client:
            if as_json:
                click.echo((await client.status()).model_dump_json(by_alias=True))
                return
            if not watch:
                console.print(status_view(await client.status()))
                return
            with Live(console=console, refresh_per_second=2) as live:
                while True:
                    live.update(status_view(await client.status()))
                    await anyio.sleep(1)

    run_async(run)(make_settings(**flags))

"""``streamworks status`` — groups, members, epochs, assignments, lag per shard."""

from __future__ import annotations

from typing import Any

import anyio
import click
from rich.live import Live

from streamworks.cli.client import coordinator_client
from streamworks.cli.common import coordinator_options, make_settings, run_async
from streamworks.cli.output import make_console
from streamworks.cli.render import status_view
from streamworks.settings import Settings

console = make_console()


@click.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--watch", is_flag=True, help="refresh every second until Ctrl-C")
@click.option("--all", "show_all", is_flag=True, help="also members that left or expired recently")
@coordinator_options
def status(as_json: bool, watch: bool, show_all: bool, **flags: Any) -> None:
    """Show streams (shards, pending, lag) and groups (members, epochs, assignments).

    --json prints the coordinator's status document (schema: docs/status-schema.json).
    """

    async def run(settings: Settings) -> None:
        where = f" at {', '.join(settings.coordinator_urls)}"

        def view(response: Any) -> Any:
            return status_view(response, show_all=show_all, where=where)

        async with coordinator_client(settings) as client:
            if as_json:
                click.echo((await client.status()).model_dump_json(by_alias=True))
                return
            if not watch:
                console.print(view(await client.status()))
                return
            with Live(console=console, refresh_per_second=2) as live:
                while True:
                    live.update(view(await client.status()))
                    await anyio.sleep(1)

    run_async(run)(make_settings(**flags))

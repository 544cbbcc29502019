"""The ``streamworks`` command: one module per command group."""

from __future__ import annotations

import click

from streamworks.cli.admin import admin
from streamworks.cli.coordinator import coordinator
from streamworks.cli.dev import dev
from streamworks.cli.dlq import dlq
from streamworks.cli.status import status
from streamworks.cli.streams import streams
from streamworks.cli.worker import worker

__all__ = ("cli", "main")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="streamworks")
def cli() -> None:
    """streamworks: consumers and producers over sharded Redis Streams."""


for command in (coordinator, worker, dev, streams, status, dlq, admin):
    cli.add_command(command)


def main() -> None:
    cli()

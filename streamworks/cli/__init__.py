"""The ``streamworks`` command: one module per command group."""

from __future__ import annotations

import sys

import click

from streamworks.cli.admin import admin
from streamworks.cli.coordinator import coordinator
from streamworks.cli.dev import dev
from streamworks.cli.dlq import dlq
from streamworks.cli.publish import publish
from streamworks.cli.status import status
from streamworks.cli.streams import streams
from streamworks.cli.worker import worker

__all__ = ("cli", "main")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="streamworks")
def cli() -> None:
    """streamworks: consumers and producers over sharded Redis Streams."""


for command in (coordinator, worker, dev, publish, streams, status, dlq, admin):
    cli.add_command(command)


def main() -> None:
    """The ``streamworks`` command: a usage mistake is one error line (exit 2), as
    every other error is; click's multi-line usage block is left to ``--help``."""
    try:
        cli.main(standalone_mode=False)
    except click.UsageError as e:
        hint = f" (see {e.ctx.command_path} --help)" if e.ctx is not None else ""
        click.echo(f"error: {e.format_message()}{hint}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(1)

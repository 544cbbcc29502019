"""Where commands write: rich consoles that are full width when piped, JSON lines."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
import orjson
from rich.console import Console

__all__ = ("confirm", "echo_json", "make_console", "stdin_is_terminal")

#: Width of a console that is not a terminal: wide enough never to cut a table (rich
#: would use 80 columns), narrow tables stay as narrow as their content.
PIPE_WIDTH = 1000


def make_console(*, stderr: bool = False) -> Console:
    """A console for a command's output; not cut to 80 columns when piped (an explicit
    ``COLUMNS`` still wins)."""
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, width=PIPE_WIDTH)
    return console


def echo_json(value: Any) -> None:
    """One JSON document on stdout (``--json``)."""
    click.echo(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode())


def stdin_is_terminal() -> bool:
    """Whether a person can answer a prompt."""
    return sys.stdin is not None and sys.stdin.isatty()


def confirm(question: str, *, yes: bool, refused: str) -> None:
    """Ask ``question`` (default no) unless ``yes``; without a terminal to ask on,
    refuse at once with one line (exit 2) saying to pass ``--yes``: a prompt nobody
    can answer must not hang a script, nor pass for a "no" that looks like a crash.

    Args:
        refused: what ``--yes`` would allow, for the error line ("to delete").
    """
    if yes:
        return
    if not stdin_is_terminal():
        click.echo(f"error: no terminal to confirm on: pass --yes {refused}", err=True)
        sys.exit(2)
    if not click.confirm(question, default=False):
        click.echo("error: aborted: nothing was changed", err=True)
        sys.exit(1)

"""Where commands write: rich consoles that are full width when piped, JSON lines."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
import orjson
from rich.console import Console

__all__ = ("echo_json", "make_console", "stdin_is_terminal")

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

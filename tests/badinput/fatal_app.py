"""An app whose handlers raise what kills a process (``BaseException`` subclasses),
run as a real ``streamworks worker tests.badinput.fatal_app:app`` child.

Only a process started with ``BADINPUT_FATAL=1`` misbehaves: a message
``{"id": ..., "raise": KIND}`` makes the handler raise KIND. Anywhere else (the test
process, whose in-process worker takes the message over) the handlers record what
they handled in :data:`handled` instead.
"""

from __future__ import annotations

import _thread
import asyncio
import os
import sys
from typing import Any

from streamworks import App, Message, RetryPolicy

GROUP = "badinput-fatal"
ASYNC_STREAM = "fatal-async"
SYNC_STREAM = "fatal-sync"

app = App(GROUP)
app.stream(ASYNC_STREAM, shards=1)
app.stream(SYNC_STREAM, shards=1)

#: (stream, id, attempt) of every message handled without misbehaving (test process).
handled: list[tuple[str, str, int]] = []


class FatalError(BaseException):
    """A BaseException subclass of the application's own (not an Exception)."""


def _misbehave(kind: str) -> None:
    if kind == "KeyboardInterrupt":
        raise KeyboardInterrupt
    if kind == "SystemExit(0)":
        sys.exit(0)
    if kind == "SystemExit(3)":
        sys.exit(3)
    if kind == "FatalError":
        raise FatalError("the application gave up")
    if kind == "GeneratorExit":
        raise GeneratorExit
    if kind == "CancelledError":
        raise asyncio.CancelledError  # not a cancellation: raised by the handler itself
    if kind == "thread exit":
        _thread.exit()  # SystemExit: what ends a plain thread silently
    raise AssertionError(f"unknown kind {kind!r}")


def _run(stream: str, value: dict[str, Any], msg: Message) -> None:
    if os.environ.get("BADINPUT_FATAL") == "1" and value.get("raise"):
        _misbehave(value["raise"])
    handled.append((stream, value["id"], msg.attempt))


@app.handler(ASYNC_STREAM, retry=RetryPolicy(max_attempts=3, backoff=0.01))
async def on_async(value: dict[str, Any], msg: Message) -> None:
    _run(ASYNC_STREAM, value, msg)


@app.handler(SYNC_STREAM, retry=RetryPolicy(max_attempts=3, backoff=0.01))
def on_sync(value: dict[str, Any], msg: Message) -> None:
    _run(SYNC_STREAM, value, msg)

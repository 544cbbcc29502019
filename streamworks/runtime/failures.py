"""Handler failure tracebacks: logged at a bounded rate, stored in dead letters.

A handler that fails on every message of a busy stream would otherwise write a
traceback per message. :class:`TracebackLog` logs at most one full traceback per
handler per ``WorkerSettings.traceback_interval`` seconds; the failures in between
keep their one-line log record (``execution.py``), marked ``traceback suppressed``,
and the next traceback says how many were suppressed since the last one.

A dead-lettered message carries the traceback of its last failed attempt in its
``traceback`` field (:func:`traceback_text`, the last :data:`MAX_TRACEBACK` bytes:
the innermost frames, where the error was raised, are the ones kept).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from streamworks.clock import boottime

if TYPE_CHECKING:
    from streamworks.runtime.message import Message

__all__ = (
    "MAX_TRACEBACK",
    "TracebackLog",
    "cancelled_from_outside",
    "clip",
    "describe",
    "traceback_text",
)

log = logging.getLogger("streamworks.handler")

#: A dead letter's ``traceback`` field holds at most this many bytes (UTF-8).
MAX_TRACEBACK = 8192
_CUT = "... (traceback cut to its last {} bytes)\n"


def traceback_text(error: BaseException, limit: int = MAX_TRACEBACK) -> str:
    """The formatted traceback of ``error`` (with its causes), at most ``limit``
    bytes of UTF-8: when longer, its end, after a line saying it was cut."""
    try:
        text = "".join(traceback.format_exception(error))
    except Exception:  # a broken __str__ or __repr__ deep in the chain
        text = f"{type(error).__name__} (its traceback could not be formatted)\n"
    raw = text.encode("utf-8", "backslashreplace")
    if len(raw) <= limit:
        return raw.decode("utf-8")
    head = _CUT.format(limit)
    tail = raw[-(limit - len(head)) :].decode("utf-8", "ignore")
    return head + tail


class TracebackLog:
    """At most one logged traceback per ``interval`` seconds, for one handler.

    Args:
        group: the group (in the log record).
        handler: the handler's name (in the log record).
        interval: the least time between two logged tracebacks (0: every one).
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        group: str,
        handler: str,
        interval: float,
        clock: Callable[[], float] = boottime,
    ) -> None:
        self.group = group
        self.handler = handler
        self.interval = interval
        self._clock = clock
        self._last: float | None = None
        self.suppressed = 0  # tracebacks not logged since the last one that was
        self.logged = 0

    def failed(self, message: Message, error: BaseException, attempt: int) -> bool:
        """Log ``error``'s traceback unless one was logged less than ``interval`` ago.

        Returns:
            Whether it was logged (False: suppressed, counted).
        """
        now = self._clock()
        if self._last is not None and now - self._last < self.interval:
            self.suppressed += 1
            return False
        suppressed, self.suppressed = self.suppressed, 0
        self._last = now
        self.logged += 1
        since = f"; {suppressed} more suppressed since the last one" if suppressed else ""
        log.warning(
            "handler %s failed on %s %s (attempt %d): traceback (at most one per %gs%s)",
            self.handler,
            message.shard,
            message.id,
            attempt,
            self.interval,
            since,
            exc_info=error,
            extra={
                "group": self.group,
                "stream": message.stream,
                "shard": message.shard,
                "entry_id": message.id,
            },
        )
        return True


def describe(error: BaseException) -> str:
    """``Type: message`` of an exception, even one whose ``str()`` fails."""
    try:
        text = str(error)
    except Exception:
        text = "<unprintable>"
    # Always "Name: text", even with an empty text: one shape for whoever parses it.
    return f"{type(error).__name__}: {text}"


def cancelled_from_outside(error: BaseException) -> bool:
    """A real cancellation of this task (a cancel scope, a hard stop), as opposed to a
    ``CancelledError`` the handler raised itself (e.g. awaiting a cancelled future)."""
    if not isinstance(error, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"

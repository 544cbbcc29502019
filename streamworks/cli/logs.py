"""Log output of the long-running commands: text for people, JSON lines for machines.

``--log-format json`` writes one JSON object per record with ``ts``, ``level``,
``logger`` and ``message``, plus the record's contextual fields — those given with
``extra=`` by the code that logs (``group``, ``stream``, ``shard``, ``entry_id``,
``member``, ...) and those a :class:`ContextFilter` adds to every record of the
process (a worker's group and member id) — and ``exception`` with the formatted
traceback when there is one.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

__all__ = ("LEVELS", "ContextFilter", "JsonFormatter", "configure_logging")

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

#: Attributes every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per line (orjson; values it cannot encode become strings)."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(
            (name, value)
            for name, value in vars(record).items()
            if name not in _STANDARD and not name.startswith("_") and value is not None
        )
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exception"] = record.exc_text
        return orjson.dumps(data, default=str).decode()


class ContextFilter(logging.Filter):
    """Adds process-wide fields (e.g. ``group``, ``member``) to records lacking them."""

    def __init__(self, **fields: str) -> None:
        super().__init__()
        self.fields = dict(fields)

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in self.fields.items():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


def configure_logging(level: str, fmt: str = "text") -> ContextFilter:
    """Send every record of ``level`` and above to stderr as ``fmt`` (text or json);
    the returned filter takes fields to add to every record."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    context = ContextFilter()
    handler.addFilter(context)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return context

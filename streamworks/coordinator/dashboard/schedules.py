"""The dashboard's "Schedules" table: each group's periodic schedules, with the last
and next tick (from ``status``: what the schedule shard's owner recorded)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from streamworks.protocol.control import GroupInfo

__all__ = ("ScheduleRow", "schedule_rows", "tick_time")


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    name: str
    stream: str
    spec: str
    last: str
    next: str
    pending: str
    published: int
    duplicate: int
    skipped: int


def tick_time(ms: int | None) -> str:
    """A tick's instant as ``2026-12-02 09:00:00 UTC`` ('–' when unknown)."""
    if ms is None:
        return "–"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def schedule_rows(group: GroupInfo) -> list[ScheduleRow]:
    return [
        ScheduleRow(
            name=s.name,
            stream=s.stream,
            spec=s.spec,
            last=tick_time(s.last_tick_ms),
            next=tick_time(s.next_tick_ms),
            pending=tick_time(s.pending_tick_ms) if s.pending_tick_ms is not None else "",
            published=s.published,
            duplicate=s.duplicate,
            skipped=s.skipped,
        )
        for s in group.schedules
    ]

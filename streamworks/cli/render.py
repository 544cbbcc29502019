"""Rich tables for streams and groups (``streams``, ``status``)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from rich.console import Group as Renderables
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from streamworks.cli.common import plural
from streamworks.coordinator.dashboard.schedules import tick_time
from streamworks.protocol.control import (
    CLIENT_METRICS,
    GroupInfo,
    MemberInfo,
    StatusResponse,
    StreamInfo,
)

__all__ = ("fence_left", "group_table", "migration_summary", "status_view", "stream_table")

#: Member states of the coordinator's tombstones (left, lease expired, fenced).
_GONE = frozenset({"EXPIRED", "FENCED"})


def stream_table(stream: StreamInfo) -> RenderableType:
    """The stream's heading (never wrapped to the table's width) and its shards."""
    title = (
        f"stream [b]{stream.name}[/b]: {plural(stream.shard_count, 'routable shard')}, "
        f"routing v{stream.routing_version} ({stream.protocol})"
    )
    summary = migration_summary(stream.migration)
    if summary:
        title += f"\n{summary}"
    table = Table()
    table.add_column("shard")
    table.add_column("state")
    table.add_column("length", justify="right")
    table.add_column("group")
    table.add_column("owner")
    table.add_column("pending", justify="right")
    table.add_column("lag", justify="right")
    for shard in stream.shards:
        length = "" if shard.length is None else str(shard.length)
        if shard.delayed:  # not in the stream yet: they enter it when due (docs/delays.md)
            length += f" +{shard.delayed} delayed"
        if not shard.groups:
            table.add_row(shard.shard, shard.state, length, "", "", "", "")
        for i, g in enumerate(shard.groups):
            lag = "[red]nil[/red]" if g.lag is None else str(g.lag)
            table.add_row(
                shard.shard if i == 0 else "",
                shard.state if i == 0 else "",
                length if i == 0 else "",
                g.group,
                (g.owner or "-")[:12],
                str(g.pending),
                lag,
            )
    return Renderables(_heading(title), table)


def _heading(markup: str) -> Text:
    """A title above a table, as wide as the console (a table's own title wraps to
    the table's width, and narrow tables cut their titles into several lines)."""
    text = Text.from_markup(markup)
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


def fence_left(migration: Mapping[str, object] | None, now_ms: int | None = None) -> float | None:
    """Seconds until the migration's routing fence passes (None: no fence; 0: passed).

    The fence is Redis time on the coordinator; this process's clock stands in for it,
    which is close enough for a countdown."""
    raw = (migration or {}).get("routing_fence_ms")
    if not isinstance(raw, int | float | str):
        return None
    try:
        fence = int(raw)
    except ValueError:
        return None
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return max(0.0, (fence - now) / 1000)


def migration_summary(migration: Mapping[str, object] | None) -> str:
    """One line on a stream's migration, or "" when there is nothing to say."""
    if not migration:
        return ""
    phase = str(migration.get("phase", "NONE"))
    draining = _strings(migration.get("draining"))
    retired = _strings(migration.get("retired"))
    if phase == "NONE":
        return (
            f"last migration complete ({plural(len(retired), 'shard')} retired)" if retired else ""
        )
    if phase == "FENCING":
        left = fence_left(migration)
        wait = f", routing fence in {left:.0f}s" if left is not None else ""
        return (
            f"migration: FENCING — {plural(len(draining), 'shard')} leave routing; producers "
            f"may hold the old routing until the fence{wait}"
        )
    blocked = migration.get("blocked")
    waiting = (
        f"; waiting for {plural(len(blocked), 'shard')}"
        if isinstance(blocked, dict) and blocked
        else ""
    )
    return f"migration: {phase} — {plural(len(draining), 'shard')} draining{waiting}"


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def group_table(
    group: GroupInfo, *, show_all: bool = False, streams: Mapping[str, StreamInfo] | None = None
) -> RenderableType:
    """The group's heading, its members, its dead letters and hints; members that left
    or expired (kept for a while by the coordinator so a late heartbeat is answered
    right) only with ``show_all``."""
    gone = [m for m in group.members if m.state in _GONE]
    alive = [m for m in group.members if m.state not in _GONE]
    members = group.members if show_all else alive
    title = (
        f"group [b]{group.group}[/b]: {group.state}, epoch {group.group_epoch} "
        f"(target {group.target_epoch}), metadata v{group.metadata_version}"
    )
    table = Table()
    table.add_column("member")
    table.add_column("state")
    table.add_column("epoch", justify="right")
    table.add_column("assigned")
    table.add_column("revoking")
    table.add_column("pending")
    table.add_column("lease", justify="right")
    table.add_column("host/pid")
    table.add_column("metrics")
    for m in sorted(members, key=lambda m: m.member_id):
        pending = sorted(set(m.target) - set(m.assigned))
        lease = "" if m.lease_expires_in_ms is None else f"{m.lease_expires_in_ms / 1000:.1f}s"
        metrics = m.client.get(CLIENT_METRICS)
        table.add_row(
            m.member_id[:12],
            m.state,
            str(m.epoch),
            _shards(m.assigned),
            _shards(m.pending_revocation),
            _shards(pending),
            lease,
            f"{m.client.get('host', '')}/{m.client.get('pid', '')}",
            f"{metrics}/metrics" if metrics else "-",
        )
    notes: list[RenderableType] = []
    if gone and not show_all:
        left = plural(len(gone), "member")
        notes.append(Text(f"{left} left or expired recently (status --all shows them)"))
    dead = {s: n for s, n in sorted(group.dead_letters.items()) if n}
    if group.dead_letters:
        counts = ", ".join(f"{s} {n}" for s, n in dead.items()) if dead else "none"
        line = Text(f"dead letters: {counts}", style="yellow" if dead else "")
        if dead:
            line.append(f"  (streamworks dlq show {group.group} STREAM)", style="dim")
        notes.append(line)
    hint = _idle_hint(group, alive, streams or {})
    if hint:
        notes.append(Text(hint, style="yellow"))
    if group.schedules:
        notes.append(schedule_table(group))
    return Renderables(_heading(title), table, *notes)


def schedule_table(group: GroupInfo) -> RenderableType:
    """The group's periodic schedules: last and next tick (UTC), counters."""
    table = Table(title=f"schedules of {group.group}", title_justify="left")
    for column in ("schedule", "stream", "when", "last tick", "next tick", "pending"):
        table.add_column(column)
    for column in ("published", "duplicate", "skipped"):
        table.add_column(column, justify="right")
    for s in group.schedules:
        table.add_row(
            s.name,
            s.stream,
            s.spec,
            tick_time(s.last_tick_ms),
            tick_time(s.next_tick_ms),
            tick_time(s.pending_tick_ms) if s.pending_tick_ms is not None else "",
            str(s.published),
            str(s.duplicate),
            str(s.skipped),
        )
    return table


def _idle_hint(group: GroupInfo, alive: list[MemberInfo], streams: Mapping[str, StreamInfo]) -> str:
    """Why some members have nothing to read, when they are settled and do not: more
    members than shards (each shard is read by one member of a group)."""
    idle = [m for m in alive if not m.assigned and not m.target and m.state == "STABLE"]
    if not idle or group.state != "STABLE":
        return ""
    shards = sum(streams[s].shard_count for s in group.subscriptions if s in streams)
    who = "member has" if len(idle) == 1 else "members have"
    return (
        f"{len(idle)} {who} no shards: the group has {plural(len(alive), 'member')} for "
        f"{plural(shards, 'shard')} (one member reads a shard); they take over when "
        "another member stops. To use them: streamworks streams scale STREAM --shards N"
    )


def _shards(ids: list[str]) -> str:
    return " ".join(s.split("/", 1)[1] for s in sorted(ids)) if ids else "-"


def status_view(
    status: StatusResponse, *, show_all: bool = False, where: str = ""
) -> RenderableType:
    """Every stream and group, after the alerts; a clear line when there is nothing."""
    alerts: list[RenderableType] = [Text(f"ALERT: {a}", style="bold red") for a in status.alerts]
    if not status.streams and not status.groups:
        return Renderables(
            *alerts,
            Text(
                f"no streams and no groups yet{where}: create a stream (streamworks streams "
                "create NAME --shards N) or start a worker"
            ),
        )
    by_name = {s.name: s for s in status.streams}
    parts: list[RenderableType] = [stream_table(s) for s in status.streams]
    parts += [group_table(g, show_all=show_all, streams=by_name) for g in status.groups]
    return Renderables(*alerts, *parts)

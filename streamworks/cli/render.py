"""Rich tables for streams and groups (``streams``, ``status``)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from rich.console import Group as Renderables
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from streamworks.protocol.control import GroupInfo, StatusResponse, StreamInfo

__all__ = ("fence_left", "group_table", "migration_summary", "status_view", "stream_table")

#: Member states of the coordinator's tombstones (left, lease expired, fenced).
_GONE = frozenset({"EXPIRED", "FENCED"})


def stream_table(stream: StreamInfo) -> Table:
    title = (
        f"stream [b]{stream.name}[/b]: {stream.shard_count} routable shards, "
        f"routing v{stream.routing_version} ({stream.protocol})"
    )
    summary = migration_summary(stream.migration)
    if summary:
        title += f"\n{summary}"
    table = Table(title=title, title_justify="left")
    table.add_column("shard")
    table.add_column("state")
    table.add_column("length", justify="right")
    table.add_column("group")
    table.add_column("pending", justify="right")
    table.add_column("lag", justify="right")
    for shard in stream.shards:
        length = "" if shard.length is None else str(shard.length)
        if not shard.groups:
            table.add_row(shard.shard, shard.state, length, "", "", "")
        for i, g in enumerate(shard.groups):
            lag = "[red]nil[/red]" if g.lag is None else str(g.lag)
            table.add_row(
                shard.shard if i == 0 else "",
                shard.state if i == 0 else "",
                length if i == 0 else "",
                g.group,
                str(g.pending),
                lag,
            )
    return table


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
        return f"last migration complete ({len(retired)} shards retired)" if retired else ""
    if phase == "FENCING":
        left = fence_left(migration)
        wait = f", routing fence in {left:.0f}s" if left is not None else ""
        return (
            f"migration: FENCING — {len(draining)} shards leave routing; producers may hold "
            f"the old routing until the fence{wait}"
        )
    blocked = migration.get("blocked")
    waiting = (
        f"; waiting for {len(blocked)} shards" if isinstance(blocked, dict) and blocked else ""
    )
    return f"migration: {phase} — {len(draining)} shards draining{waiting}"


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def group_table(group: GroupInfo, *, show_all: bool = False) -> Table:
    """The group's members; members that left or expired (kept for a while by the
    coordinator so a late heartbeat is answered right) only with ``show_all``."""
    gone = [m for m in group.members if m.state in _GONE]
    members = group.members if show_all else [m for m in group.members if m.state not in _GONE]
    caption = (
        f"{len(gone)} members left or expired recently (status --all shows them)"
        if gone and not show_all
        else None
    )
    table = Table(
        caption=caption,
        caption_justify="left",
        title=(
            f"group [b]{group.group}[/b]: {group.state}, epoch {group.group_epoch} "
            f"(target {group.target_epoch}), metadata v{group.metadata_version}"
        ),
        title_justify="left",
    )
    table.add_column("member")
    table.add_column("state")
    table.add_column("epoch", justify="right")
    table.add_column("assigned")
    table.add_column("revoking")
    table.add_column("pending")
    table.add_column("lease", justify="right")
    table.add_column("host/pid")
    for m in sorted(members, key=lambda m: m.member_id):
        pending = sorted(set(m.target) - set(m.assigned))
        lease = "" if m.lease_expires_in_ms is None else f"{m.lease_expires_in_ms / 1000:.1f}s"
        table.add_row(
            m.member_id[:12],
            m.state,
            str(m.epoch),
            _shards(m.assigned),
            _shards(m.pending_revocation),
            _shards(pending),
            lease,
            f"{m.client.get('host', '')}/{m.client.get('pid', '')}",
        )
    return table


def _shards(ids: list[str]) -> str:
    return " ".join(s.split("/", 1)[1] for s in sorted(ids)) if ids else "-"


def status_view(
    status: StatusResponse, *, show_all: bool = False, where: str = ""
) -> RenderableType:
    """Every stream and group; a clear line when there is nothing."""
    if not status.streams and not status.groups:
        return Text(
            f"no streams and no groups yet{where}: create a stream (streamworks streams "
            "create NAME --shards N) or start a worker"
        )
    parts: list[Table] = [stream_table(s) for s in status.streams]
    parts += [group_table(g, show_all=show_all) for g in status.groups]
    return Renderables(*parts)

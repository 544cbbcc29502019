"""Rich tables for streams and groups (``streams``, ``status``)."""

from __future__ import annotations

from rich.console import Group as Renderables
from rich.table import Table

from streamworks.protocol.control import GroupInfo, StatusResponse, StreamInfo

__all__ = ("group_table", "status_view", "stream_table")


def stream_table(stream: StreamInfo) -> Table:
    title = (
        f"stream [b]{stream.name}[/b]: {stream.shard_count} routable shards, "
        f"routing v{stream.routing_version} ({stream.protocol})"
    )
    if stream.migration:
        title += f"\nmigration: {stream.migration.get('phase', '?')} {stream.migration}"
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


def group_table(group: GroupInfo) -> Table:
    table = Table(
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
    for m in sorted(group.members, key=lambda m: m.member_id):
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


def status_view(status: StatusResponse) -> Renderables:
    parts: list[Table] = [stream_table(s) for s in status.streams]
    parts += [group_table(g) for g in status.groups]
    return Renderables(*parts)

"""What the dashboard shows, computed from one observation: pure functions building
plain view objects the templates render (no I/O here, no Redis, no HTTP)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from markupsafe import Markup

from streamworks.coordinator.dashboard.schedules import ScheduleRow, schedule_rows
from streamworks.coordinator.dashboard.throughput import GroupRate, metrics_url
from streamworks.coordinator.observation import Observation, Sample
from streamworks.protocol.control import GroupInfo, MemberInfo, StreamInfo

__all__ = ("Page", "build_page", "sparkline")

#: Member colours cycle through this many CSS classes (``c0`` …).
COLOURS = 8
_TOMBSTONES = frozenset({"EXPIRED", "FENCED"})


@dataclass(frozen=True, slots=True)
class MemberRow:
    member_id: str
    short: str
    state: str
    epoch: int
    host: str
    pid: str
    lease_s: float | None
    assigned: list[str]
    revoking: list[str]
    pending: list[str]  # in its target, not granted yet
    colour: int | None  # None for a member that left (EXPIRED, FENCED)
    metrics: str | None  # its /metrics URL, when it serves one over http(s)


@dataclass(frozen=True, slots=True)
class ShardCell:
    shard: str
    index: str  # "3@0"
    state: str
    owner: MemberRow | None
    revoking: MemberRow | None


@dataclass(frozen=True, slots=True)
class StreamMap:
    stream: str
    cells: list[ShardCell]


@dataclass(frozen=True, slots=True)
class GroupView:
    name: str
    state: str
    epoch: int
    target_epoch: int
    metadata_version: int
    live: int
    members: list[MemberRow]
    maps: list[StreamMap]
    hint: str | None = None  # why some members have nothing to read
    schedules: list[ScheduleRow] = field(default_factory=list)  # schedules.py


@dataclass(frozen=True, slots=True)
class PositionRow:
    stream: str
    shard: str
    state: str
    group: str
    length: int | None
    pending: int
    lag: int | None
    spark: Markup


@dataclass(frozen=True, slots=True)
class DrainingShard:
    shard: str
    waits_for: list[str]


@dataclass(frozen=True, slots=True)
class MigrationView:
    stream: str
    phase: str
    source: object
    target: object
    started_s: float | None  # seconds ago
    fence_in_s: float | None  # seconds until the routing fence (FENCING)
    draining: list[DrainingShard]


@dataclass(frozen=True, slots=True)
class StreamRow:
    name: str
    shards: int
    routing_version: int
    length: int
    phase: str


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    group: str
    stream: str
    entries: int


@dataclass(frozen=True, slots=True)
class RateRow:
    group: str
    handled: str  # per second, or "–" before two readings
    failed: str
    failure_rate: str
    read: str  # "2 of 3 members"


@dataclass(frozen=True, slots=True)
class Page:
    replica: str
    error: str | None
    alerts: list[str] = field(default_factory=list)
    streams: list[StreamRow] = field(default_factory=list)
    groups: list[GroupView] = field(default_factory=list)
    positions: list[PositionRow] = field(default_factory=list)
    migrations: list[MigrationView] = field(default_factory=list)
    dead_letters: list[DeadLetterRow] = field(default_factory=list)
    rates: list[RateRow] = field(default_factory=list)


def build_page(
    observation: Observation,
    history: Callable[[str, str], Sequence[Sample]],
    replica: str,
    rates: Sequence[GroupRate] = (),
) -> Page:
    """The whole dashboard for one observation; ``history(group, shard)`` gives the
    samples of a sparkline, ``rates`` each group's handled/s from its members."""
    status = observation.status
    if status is None:
        return Page(replica, observation.error)
    by_name = {s.name: s for s in status.streams}
    return Page(
        replica=replica,
        error=None,
        alerts=list(status.alerts),
        rates=[_rate_row(r) for r in rates],
        streams=[_stream_row(s) for s in status.streams],
        groups=[_group_view(g, by_name) for g in status.groups],
        positions=[
            PositionRow(
                stream.name,
                shard.shard,
                shard.state,
                position.group,
                shard.length,
                position.pending,
                position.lag,
                sparkline(history(position.group, shard.shard)),
            )
            for stream in status.streams
            for shard in stream.shards
            for position in shard.groups
        ],
        migrations=[
            m for s in status.streams if (m := _migration(s, observation.now_ms)) is not None
        ],
        dead_letters=[
            DeadLetterRow(group, stream, entries)
            for (group, stream), entries in sorted(observation.dead_letters.items())
        ],
    )


def _rate_row(rate: GroupRate) -> RateRow:
    def per_s(value: float | None) -> str:
        return "–" if value is None else f"{value:,.1f}/s"

    failure = rate.failure_rate
    return RateRow(
        rate.group,
        per_s(rate.handled_per_s),
        per_s(rate.failed_per_s),
        "–" if failure is None else f"{failure:.1%}",
        f"{rate.read} of {rate.members}",
    )


def _stream_row(stream: StreamInfo) -> StreamRow:
    return StreamRow(
        stream.name,
        stream.shard_count,
        stream.routing_version,
        sum(s.length or 0 for s in stream.shards),
        str((stream.migration or {}).get("phase", "NONE")),
    )


def _member_row(member: MemberInfo, colour: int | None) -> MemberRow:
    lease = member.lease_expires_in_ms
    return MemberRow(
        member_id=member.member_id,
        short=member.member_id[:8],
        state=member.state,
        epoch=member.epoch,
        host=member.client.get("host", ""),
        pid=member.client.get("pid", ""),
        lease_s=None if lease is None or member.state in _TOMBSTONES else max(0, lease) / 1000,
        assigned=sorted(member.assigned),
        revoking=sorted(member.pending_revocation),
        pending=sorted(set(member.target) - set(member.assigned)),
        colour=colour,
        metrics=metrics_url(member.client),
    )


def _group_view(group: GroupInfo, streams: dict[str, StreamInfo]) -> GroupView:
    live = sorted(
        (m for m in group.members if m.state not in _TOMBSTONES), key=lambda m: m.member_id
    )
    rows = [_member_row(m, i % COLOURS) for i, m in enumerate(live)]
    gone = sorted((m for m in group.members if m.state in _TOMBSTONES), key=lambda m: m.member_id)
    owner = {s: row for row in rows for s in row.assigned}
    revoking = {s: row for row in rows for s in row.revoking}
    maps = []
    for name in group.subscriptions:
        stream = streams.get(name)
        if stream is None:
            continue
        cells = [
            ShardCell(
                s.shard,
                s.shard.split("/", 1)[1],
                s.state,
                owner.get(s.shard),
                revoking.get(s.shard),
            )
            for s in stream.shards
        ]
        maps.append(StreamMap(name, cells))
    idle = [m for m in live if not m.assigned and not m.target and m.state == "STABLE"]
    hint = None
    if idle and group.state == "STABLE":
        shards = sum(streams[s].shard_count for s in group.subscriptions if s in streams)
        hint = (
            f"{len(idle)} of {len(live)} members have no shards: one member reads a shard, "
            f"and the group's streams have {shards}. They take over when another member "
            "stops; to use them, scale a stream out."
        )
    return GroupView(
        name=group.group,
        state=group.state,
        epoch=group.group_epoch,
        target_epoch=group.target_epoch,
        metadata_version=group.metadata_version,
        live=len(rows),
        members=rows + [_member_row(m, None) for m in gone],
        maps=maps,
        hint=hint,
        schedules=schedule_rows(group),
    )


def _migration(stream: StreamInfo, now_ms: int) -> MigrationView | None:
    migration = stream.migration or {}
    phase = str(migration.get("phase", "NONE"))
    if phase == "NONE":
        return None
    fence = _int(migration.get("routing_fence_ms"))
    started = _int(migration.get("started_ms"))
    blocked = migration.get("blocked")
    blocked = blocked if isinstance(blocked, dict) else {}
    fence_in = max(0, fence - now_ms) / 1000 if fence is not None and now_ms else None
    draining = []
    for shard in stream.shards:
        if shard.state != "DRAINING":
            continue
        waits: list[str] = []
        if phase == "FENCING":
            left = f" ({fence_in:.1f} s left)" if fence_in is not None else ""
            waits.append(f"routing fence: producers may still hold the old routing{left}")
        else:
            if shard.shard in blocked:
                waits.append(f"last drain check: {blocked[shard.shard]}")
            for g in shard.groups:
                if g.lag is None:
                    waits.append(f"group {g.group}: lag unknown (Redis reports nil)")
                elif g.lag:
                    waits.append(f"group {g.group}: {g.lag} entries not yet delivered")
                if g.pending:
                    waits.append(f"group {g.group}: {g.pending} pending (not acknowledged)")
            if not waits:
                waits.append("the next drain check (every group drained)")
        draining.append(DrainingShard(shard.shard, waits))
    return MigrationView(
        stream=stream.name,
        phase=phase,
        source=migration.get("from"),
        target=migration.get("to"),
        started_s=(now_ms - started) / 1000 if started is not None and now_ms else None,
        fence_in_s=fence_in,
        draining=draining,
    )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None


def sparkline(samples: Sequence[Sample], width: int = 120, height: int = 24) -> Markup:
    """An inline SVG of lag (and pending) over the samples, scaled to the largest
    value. Only numbers go into the markup, so it is safe to render unescaped."""
    if not samples:
        return Markup("")
    top = max(max(s.pending, s.lag or 0) for s in samples) or 1
    step = width / max(1, len(samples) - 1)

    def points(values: Sequence[int]) -> str:
        if len(values) == 1:
            values = [values[0], values[0]]
        step_ = width / (len(values) - 1) if len(samples) == 1 else step
        return " ".join(
            f"{i * step_:.1f},{height - 1 - (v / top) * (height - 2):.1f}"
            for i, v in enumerate(values)
        )

    lag = [s.lag or 0 for s in samples]
    pending = [s.pending for s in samples]
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="lag and pending, last {len(samples)} samples">'
        f'<polyline class="lag" points="{points(lag)}"/>'
        f'<polyline class="pending" points="{points(pending)}"/></svg>'
    )

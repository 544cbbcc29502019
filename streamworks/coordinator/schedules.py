"""What ``status`` says about each group's periodic schedules.

The coordinator publishes nothing for a schedule (E24): the member that owns a group's
schedule shard (``sw-schedules/0``) does, and records each schedule's state in that
shard's slot (``schedule_tick.lua``). This reads it back, with ``SMEMBERS`` of the
group's schedule names and ``HGETALL`` of each state (tick times, counters, the shard
and entry id of the last tick: never a message).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamworks.protocol.control import GroupInfo, ScheduleInfo, StreamInfo
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace

__all__ = ("schedule_shard", "with_schedules")


def schedule_shard(info: StreamInfo | None) -> ShardId | None:
    """The live shard 0 of the schedule stream (None: no app declared schedules)."""
    if info is None:
        return None
    for shard in info.shards:
        sid = ShardId.parse(shard.shard)
        if sid.index == 0 and shard.state != "RETIRED":
            return sid
    return None


async def with_schedules(
    redis: Any, keyspace: Keyspace, shard: ShardId | None, groups: Sequence[GroupInfo]
) -> list[GroupInfo]:
    """``groups``, each with its schedules (none when ``shard`` is None). Every group
    is asked, not only those whose live members subscribe to the schedule stream:
    the last tick matters most when no member runs."""
    if shard is None:
        return list(groups)
    out = []
    for group in groups:
        raw = await redis.smembers(keyspace.schedules(shard, group.group))
        names = sorted(_text(n) for n in raw)
        pipe = redis.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(keyspace.schedule_state(shard, group.group, name))
        states = await pipe.execute() if names else []
        schedules = [_info(name, state) for name, state in zip(names, states, strict=True)]
        out.append(group.model_copy(update={"schedules": schedules}))
    return out


def _info(name: str, raw: dict[Any, Any]) -> ScheduleInfo:
    state = {_text(k): _text(v) for k, v in raw.items()}

    def number(field: str) -> int | None:
        value = state.get(field, "")
        return int(value) if value.lstrip("-").isdigit() else None

    return ScheduleInfo(
        name=name,
        stream=state.get("stream", ""),
        spec=state.get("spec", ""),
        last_tick_ms=number("last"),
        next_tick_ms=number("next"),
        pending_tick_ms=number("pending"),
        last_shard=state.get("last_shard") or None,
        last_entry=state.get("last_entry") or None,
        published=number("published") or 0,
        duplicate=number("duplicate") or 0,
        skipped=number("skipped") or 0,
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

"""Repair of the ``lag`` of ACTIVE shards after a Redis < 7.4 restart (docs/protocol.md#migrations).

Redis before 7.4 does not persist a consumer group's ``entries-read`` across an AOF
reload (nor send it to replicas: a promoted replica has the same problem): it replays
a group's reads as ``XCLAIM … LASTID``, which does not count them (fixed by
redis/redis#12898, first released in 7.4; Valkey forked after it, so Valkey 8.x keeps
the counter). After a restart ``XINFO GROUPS`` shows ``lag`` nil or above 0 on a shard
a group has read to the end. For a DRAINING shard the drain check repairs it before
retiring (``retire.lua``); a shard that stays ACTIVE would show the wrong lag for good
(``streamworks status``, ``wait_idle`` and the lag gauges see work that is not there),
until the next entry is read — and on an idle shard there is none.

So the event loop runs the same script in ``repair`` mode over the ACTIVE shards of
each stream. It writes only when the id-based proof holds for a group — every group
that must exist on the shard is present, the group has no pending entries, and its
last-delivered-id is *equal* to the stream's last-generated-id, so it has been
delivered every entry ever added — and its lag is nil or above 0: then ``ENTRIESREAD``
is set to the stream's entries-added, so lag is exactly 0. Each repair is logged and
counted (``streamworks_drain_repairs_total``). The script is atomic on the shard, so no
stream lock is needed: it changes nothing but the counter Redis lost.

What a pass costs is bounded:

* **only where needed**: on servers that keep the counter (Redis ≥ 7.4, Valkey ≥ 8.0,
  asked with ``HELLO`` on every node, again every :data:`SERVER_RECHECK` seconds: a
  failover may promote another version) nothing runs at all;
* **one replica per stream per interval**: a pass first takes the stream's turn
  (``SET NX PX`` of :meth:`Keyspace.lag_repair_turn` for :data:`REPAIR_INTERVAL`), so
  N coordinator replicas cost what one does;
* **only suspect shards**: the pass reads every ACTIVE shard's groups in one pipeline
  (``XINFO GROUPS``, one round trip per node) and runs the script only on shards where
  a group has nothing pending and a lag that is nil or above 0;
* **batched**: those scripts go out in one pipeline, not one round trip per shard.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from redis.asyncio import RedisCluster

from streamworks.coordinator import provision
from streamworks.coordinator.core.streams import StreamMeta
from streamworks.coordinator.metrics import CoordinatorMetrics
from streamworks.coordinator.store import Store
from streamworks.protocol.control import ShardGroupInfo
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.redis_py import slot_map_stale

__all__ = ("REPAIR_INTERVAL", "SERVER_RECHECK", "ActiveLagRepair", "loses_entries_read")

log = logging.getLogger("streamworks.coordinator.resharding")

#: Seconds between two repair passes over one stream's ACTIVE shards (all replicas).
REPAIR_INTERVAL = 5.0
#: Seconds between two looks at which servers answer (``HELLO`` on every node).
SERVER_RECHECK = 60.0


def loses_entries_read(server: str, version: str) -> bool:
    """Whether a server forgets consumer groups' ``entries-read`` on an AOF reload or
    in replication (redis/redis#12898): Redis before 7.4, Valkey before 8.0, and any
    server this cannot tell (repairing where it is not needed costs, but never harms)."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return True
    if server == "redis":
        return (major, minor) < (7, 4)
    if server == "valkey":
        return major < 8
    return True


def _suspect(groups: list[ShardGroupInfo]) -> bool:
    """A group with nothing pending and a lag that is nil or above 0: what a lost
    ``entries-read`` looks like (a group that really lags too; the script tells)."""
    return any(g.pending == 0 and (g.lag is None or g.lag > 0) for g in groups)


class ActiveLagRepair:
    """The repair passes of one replica (see the module docstring).

    Args:
        needed: whether the servers lose ``entries-read`` (None: ask them, ``HELLO``).
    """

    def __init__(
        self,
        store: Store,
        keyspace: Keyspace,
        metrics: CoordinatorMetrics,
        interval: float = REPAIR_INTERVAL,
        *,
        needed: bool | None = None,
    ) -> None:
        self.store = store
        self.keyspace = keyspace
        self.metrics = metrics
        self.interval = interval
        self.needed = needed
        self._asked_at = -SERVER_RECHECK  # monotonic time of the last HELLO round
        self._lossy: bool | None = None  # what it told
        self._token = secrets.token_hex(8)
        self._last: dict[str, float] = {}  # stream -> monotonic time of its last pass
        self.repairs = 0
        self.passes = 0  # passes that read the shards (statistics, tests)

    async def _servers_lose_counter(self) -> bool:
        if self.needed is not None:
            return self.needed
        now = self.store.clock.monotonic()
        if now - self._asked_at >= SERVER_RECHECK or self._lossy is None:
            self._asked_at = now
            self._lossy = await self._ask_servers()
        return self._lossy

    async def _ask_servers(self) -> bool:
        redis = self.store.redis
        try:
            if isinstance(redis, RedisCluster):
                if slot_map_stale(redis):  # the node list is loaded on first use
                    await redis.initialize()
                # Every node the client knows, replicas too where it lists them.
                raw = await redis.execute_command("HELLO", target_nodes=redis.get_nodes())
                replies = list(raw.values()) if not _is_hello(raw) else [raw]
            else:
                replies = [await redis.execute_command("HELLO")]
            servers = [_server(reply) for reply in replies]
        except Exception as e:  # cannot tell: repair (it never harms)
            log.warning("could not ask Redis which server it is (%s): lag repair stays on", e)
            return True
        return not servers or any(loses_entries_read(*server) for server in servers)

    async def maybe_repair(self, name: str, meta: StreamMeta) -> int:
        """Repair the ACTIVE shards of ``name`` when its pass is due and needed; the
        number of shards repaired."""
        now = self.store.clock.monotonic()
        if now - self._last.get(name, -self.interval) < self.interval:
            return 0
        self._last[name] = now
        if len(self._last) > 4096:
            self._last = {name: now}
        if not await self._servers_lose_counter():
            return 0
        # One replica per stream per interval: whoever takes the turn.
        turn = self.keyspace.lag_repair_turn(name)
        if not await self.store.redis.set(
            turn, self._token, nx=True, px=max(1, int(self.interval * 1000))
        ):
            return 0
        self.passes += 1
        shards = [ShardId.parse(s) for s in meta.shard_ids(meta.routable())]
        positions = await self.store.shard_positions(shards)
        suspects = [
            shard
            for shard, found in zip(shards, positions, strict=True)
            if found is not None and _suspect(found[1])
        ]
        if not suspects:
            return 0
        groups = sorted(await self.store.subscribed_groups(name))
        checks = await provision.drain_checks(
            self.store.scripts, self.keyspace, suspects, groups, mode="repair"
        )
        repaired = 0
        for shard, check in zip(suspects, checks, strict=True):
            if check.status is provision.DrainStatus.REPAIRED:
                repaired += 1
                self.repairs += 1
                self.metrics.drain_repairs.labels(name).inc()
                log.warning("stream %s: active %s: %s", name, shard, check.reason)
        return repaired


def _is_hello(reply: Any) -> bool:
    """Whether ``reply`` is one ``HELLO`` answer (not a node -> answer map)."""
    return isinstance(reply, dict) and any(_text(k) == "server" for k in reply)


def _server(reply: Any) -> tuple[str, str]:
    """``(server, version)`` of one ``HELLO`` answer (a map, or RESP2's flat list)."""
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=False)
    info = {_text(k): v for k, v in items}
    return _text(info.get("server", "")), _text(info.get("version", ""))


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

"""Repair of the ``lag`` of ACTIVE shards after a Redis < 7.4 restart (PROTOCOL §6).

Redis before 7.4 does not persist a consumer group's ``entries-read`` across an AOF
reload: after a restart, ``XINFO GROUPS`` shows ``lag`` nil or above 0 on a shard a
group has read to the end. For a DRAINING shard the drain check repairs it before
retiring (``retire.lua``); a shard that stays ACTIVE would show the wrong lag for
good (``streamworks status``, ``wait_idle`` and the lag gauges see work that is not
there), until the next entry is read — and on an idle shard there is none.

So every replica's event loop runs the same script in ``repair`` mode over the ACTIVE
shards of each stream, rate-limited (:data:`REPAIR_INTERVAL` per stream). It writes only
when the id-based proof holds for a group — every group that must exist on the shard
is present, the group has no pending entries, and its last-delivered-id is *equal* to
the stream's last-generated-id, so it has been delivered every entry ever added — and
its lag is nil or above 0: then ``ENTRIESREAD`` is set to the stream's entries-added, so
lag is exactly 0. On Redis ≥ 7.4 (and Valkey) nothing is ever written. Each repair is
logged and counted (``streamworks_drain_repairs_total``). The script is atomic on the
shard, so no stream lock is needed: it changes nothing but the counter Redis lost.
"""

from __future__ import annotations

import logging
import time

from streamworks.coordinator import provision
from streamworks.coordinator.core.streams import StreamMeta
from streamworks.coordinator.metrics import CoordinatorMetrics
from streamworks.coordinator.store import Store
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace

__all__ = ("REPAIR_INTERVAL", "ActiveLagRepair")

log = logging.getLogger("streamworks.coordinator.resharding")

#: Seconds between two repair passes over one stream's ACTIVE shards (per replica).
REPAIR_INTERVAL = 5.0


class ActiveLagRepair:
    """The rate-limited repair pass of one replica (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        keyspace: Keyspace,
        metrics: CoordinatorMetrics,
        interval: float = REPAIR_INTERVAL,
    ) -> None:
        self.store = store
        self.keyspace = keyspace
        self.metrics = metrics
        self.interval = interval
        self._last: dict[str, float] = {}  # stream -> monotonic time of its last pass
        self.repairs = 0

    async def maybe_repair(self, name: str, meta: StreamMeta) -> int:
        """Repair the ACTIVE shards of ``name`` when its pass is due; the number of
        shards repaired."""
        now = time.monotonic()
        if now - self._last.get(name, -self.interval) < self.interval:
            return 0
        self._last[name] = now
        if len(self._last) > 4096:
            self._last = {name: now}
        groups = sorted(await self.store.subscribed_groups(name))
        repaired = 0
        for shard_id in meta.shard_ids(meta.routable()):
            check = await provision.drain_check(
                self.store.scripts, self.keyspace, ShardId.parse(shard_id), groups, mode="repair"
            )
            if check.status is provision.DrainStatus.REPAIRED:
                repaired += 1
                self.repairs += 1
                self.metrics.drain_repairs.labels(name).inc()
                log.warning("stream %s: active %s: %s", name, shard_id, check.reason)
        return repaired

"""Watching the namespace identity: did Redis lose this namespace's data?

A replica claims the namespace id once (``redis/namespace.py``) and hands it to every
member and producer. If Redis then loses its data under the running replica — a
restart without persistence, a ``FLUSHALL``, a failover to an empty replica — the id
disappears (or, once another replica restarted, is replaced by a new one), and with
it every stream, group, position and unread message. Nothing else would say so:
members rejoin and sit idle, groups show STABLE with nothing assigned, and a new
worker fails its namespace check.

:class:`NamespaceIdentity` reads the id every loop interval and, while it is missing
or changed, says so loudly in one sentence (:attr:`NamespaceIdentity.problem`, with
the fix): logged at ERROR every :data:`REPEAT` seconds, the gauge
``streamworks_coordinator_namespace_lost`` at 1, the ``alerts`` of ``status`` (and
the dashboard's banner), and ``/readyz`` failing with it. A read that fails (Redis
down, loading its data) proves nothing and changes nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from prometheus_client import Gauge
from redis.exceptions import RedisError

from streamworks.redis.client import masked_url
from streamworks.redis.namespace import read_namespace

if TYPE_CHECKING:
    from streamworks.coordinator.service import CoordinatorService

__all__ = ("REPEAT", "NamespaceIdentity")

log = logging.getLogger("streamworks.coordinator")

#: Seconds between two ERROR lines while the problem lasts.
REPEAT = 10.0

_FIX = (
    "Fix: restart every coordinator replica (a new namespace is created), then every "
    "worker and producer (they declare their streams again); to keep it from happening, "
    "give Redis persistence (appendonly yes) or replicas (docs/runbook.md, 'Redis lost "
    "its data')"
)


class NamespaceIdentity:
    """Checks that Redis still holds the namespace id this replica serves.

    Args:
        service: the replica (its Redis, keyspace, claimed id, clock and metrics).
        interval: seconds between two checks.
    """

    def __init__(self, service: CoordinatorService, *, interval: float) -> None:
        self.service = service
        self.interval = interval
        #: What is wrong, with the fix; None while the namespace is intact.
        self.problem: str | None = None
        self.checks = 0
        self._logged_at: float | None = None
        self._gauge = Gauge(
            "streamworks_coordinator_namespace_lost",
            "1 while Redis no longer holds the namespace id this replica serves (Redis "
            "lost its data): see the replica's log, status and /readyz",
            registry=service.metrics.registry,
        )

    async def run(self) -> None:
        """Check every ``interval`` seconds, until cancelled."""
        clock = self.service.clock
        while True:
            await self.check()
            await clock.sleep(self.interval)

    async def check(self) -> str | None:
        """One check; the problem (also kept in :attr:`problem`), or None."""
        service = self.service
        served = service.state.namespace_id
        if served is None:
            return self.problem  # nothing handed out yet: nothing can be stale
        try:
            found = await read_namespace(service.redis, service.keyspace)
        except (RedisError, OSError):
            return self.problem  # unreachable or loading: no evidence either way
        self.checks += 1
        self.problem = None if found == served else self._describe(served, found)
        self._gauge.set(0 if self.problem is None else 1)
        if self.problem is None:
            if self._logged_at is not None:
                log.warning("Redis holds namespace %s again: the alert is over", served)
            self._logged_at = None
            return None
        now = service.clock.monotonic()
        if self._logged_at is None or now - self._logged_at >= REPEAT:
            self._logged_at = now
            log.error("%s", self.problem)
        return self.problem

    def _describe(self, served: str, found: str | None) -> str:
        service = self.service
        where = (
            f"Redis {masked_url(service.settings.redis_url)} (key prefix "
            f"{service.keyspace.prefix!r})"
        )
        if found is None:
            what = (
                f"{where} lost this namespace's data: its namespace id {served} "
                f"({service.keyspace.namespace()}) is gone (Redis restarted without "
                "persistence, was flushed, or failed over to an empty replica), and with it "
                "every stream, group, position and unread message"
            )
        else:
            what = (
                f"{where} holds namespace {found}, not {served} that this replica serves: "
                "its data was lost and another coordinator replica created a new namespace "
                "since; this replica's view is stale"
            )
        return f"{what}. {_FIX}"

    def alerts(self) -> list[str]:
        """The ``alerts`` of ``status``: the problem, if any."""
        return [self.problem] if self.problem is not None else []

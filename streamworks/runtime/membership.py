"""The worker's side of membership: the heartbeat loop (an assignment source).

Each heartbeat reports what the member reads (``ownedShards``), what it still drains
(``revokingShards``) and where its fenced reads were refused (``fencedShards``), and
applies the answer:

* ``assigned`` — shards it may read now; their owner fences are already written;
* ``revoke`` — DRAIN: stop reading, finish and ack in-flight work, report drained.
  A revoking shard is never read again on that grant, whatever happens to later
  heartbeats (E7);
* ``FENCED`` / ``UNKNOWN_MEMBER`` / ``SYNC_METADATA`` — drop every shard at once
  (running async handlers are cancelled, their entries stay pending), wait until every
  run has ended (a sync run that outlives the old lease's fail-stop point exits the
  process), and only then rejoin with epoch 0 and the same member id: the rejoin
  renews the lease, and no run started under the old one may still be going then
  (docs/guarantees.md#exclusive-processing). ``SYNC_METADATA`` means Redis lost writes the
  member saw: what it holds was granted under metadata that is gone, and it gets its
  shards back only as fresh grants.

Every request carries the next **sequence number** (a re-send of the same request to
another replica keeps it, ``protocol/client.py``): the coordinator acts on a request
only if its number is above every one it acted on for this member, so a duplicated or
delayed copy can neither complete a revocation nor take a grant. A grant whose fence
token is below one this member already held for the shard is refused (dropped, logged,
counted, reported as fenced so the coordinator re-grants it under a fresh token): a
handler's ``ctx.fencing_token`` never goes down for a shard.

The local lease (E1): after a successful heartbeat sent at ``t`` the member starts
runs only until ``t + leaseTtl x (1 - drift) - margin - grace`` and cancels or
fail-stops whatever still runs before ``t + leaseTtl x (1 - drift)`` (monotonic clock,
margin = one heartbeat interval; ``deadlines.py``), so every run has ended before the
coordinator can expire it and move its shards. When the coordinator cannot be
reached, the member keeps retrying; when the lease runs out it stops reading (the
worker's lease watchdog), and reads again only on a new answer.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskStatus
from redis.exceptions import RedisError

from streamworks.exceptions import CoordinatorError, NamespaceMismatchError
from streamworks.protocol.control import HeartbeatRequest, HeartbeatResponse, HeartbeatStatus
from streamworks.protocol.shards import ShardId
from streamworks.protocol.transport import CoordinatorTransport
from streamworks.redis.namespace import NamespaceCheck, where
from streamworks.runtime import history
from streamworks.settings import Settings

if TYPE_CHECKING:
    from streamworks.runtime.worker import Worker

__all__ = ("CoordinatorAssignment",)

log = logging.getLogger("streamworks.member")

#: Answers after which the member drops every shard and rejoins once its runs ended.
_DROP_ALL = frozenset(
    {HeartbeatStatus.FENCED, HeartbeatStatus.UNKNOWN_MEMBER, HeartbeatStatus.SYNC_METADATA}
)


class CoordinatorAssignment:
    """Assignment source driven by heartbeats to the coordinator.

    Args:
        client: the transport to the coordinator (HTTP or in-process).
        settings: the member's timers (heartbeat interval, rebalance timeout).
        client_info: more of what the member tells about itself on joining (e.g.
            ``CLIENT_METRICS``, where it serves ``/metrics``).
    """

    def __init__(
        self,
        client: CoordinatorTransport,
        settings: Settings,
        *,
        client_info: Mapping[str, str] | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.client_info = dict(client_info or {})  # more of the join's client info
        self.epoch = 0
        self.metadata_version = 0
        self.status: HeartbeatStatus | None = None
        self.heartbeats = 0
        self.failures = 0
        self.last_response: HeartbeatResponse | None = None
        self._interval = settings.heartbeat_interval
        self._full = True  # next request carries subscriptions and owned shards in full
        self._namespace: tuple[str | None, frozenset[str]] | None = None  # last verified
        self._sequence = itertools.count(1)  # one number per new request, never reused
        self._highest: dict[ShardId, int] = {}  # shard -> highest fence token granted
        #: Grants refused because their token was below one held before for the shard.
        self.refused_grants = 0

    def _request(self, worker: Worker, epoch: int) -> HeartbeatRequest:
        joining = epoch == 0
        full = joining or self._full
        streams = worker.app.streams
        return HeartbeatRequest(
            member_id=worker.member_id,
            sequence=next(self._sequence),
            member_epoch=epoch,
            metadata_version=self.metadata_version,
            subscriptions=sorted(worker.subscriptions) if full else None,
            # Where the group starts on a stream it subscribes to for the first time.
            subscription_starts={s: streams[s].start for s in worker.subscriptions if s in streams}
            if full
            else None,
            owned_shards=[] if joining else sorted(str(s) for s in worker.owned_shards()),
            revoking_shards=[] if joining else sorted(str(s) for s in worker.revoking_shards()),
            fenced_shards=[] if joining else sorted(str(s) for s in worker.fenced),
            rebalance_timeout_ms=int(self.settings.rebalance_timeout * 1000),
            client={
                "host": socket.gethostname()[:200],
                "pid": str(os.getpid()),
                "version": "streamworks",
                **self.client_info,
            }
            if joining
            else None,
        )

    async def run(
        self, worker: Worker, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()  # the worker runs at once; shards come with the answers
        group = worker.group
        backoff = 0.05
        while True:
            sent = worker.clock.monotonic()
            try:
                response = await self.client.heartbeat(group, self._request(worker, self.epoch))
            except CoordinatorError as e:
                self.failures += 1
                level = (
                    logging.WARNING
                    if self.failures in (1, 10) or self.failures % 60 == 0
                    else logging.DEBUG
                )
                log.log(level, "heartbeat failed (%s): %s", e.code, e.message)
                if not e.retryable and e.code not in ("COORDINATOR_UNAVAILABLE",):
                    # E21: fail closed; keep asking, an operator has to act.
                    backoff = min(backoff * 2, self._interval)
                # On the worker's clock: TestRuntime.advance ends the backoff.
                await worker.clock.sleep(min(backoff, self._interval))
                backoff = min(backoff * 2, self._interval)
                continue
            backoff = 0.05
            self.failures = 0
            self.heartbeats += 1
            self.last_response = response
            if await self._check_namespace(worker, response):
                self._apply(worker, response, sent)
            if self.status in _DROP_ALL:
                # The join would renew the lease: rejoin only once no run started
                # under the old one is still going (the watchdog fail-stops one that
                # outlives it).
                if worker.runs.count():
                    log.warning(
                        "member %s: waiting for %d handler runs to end before rejoining",
                        worker.member_id[:8],
                        worker.runs.count(),
                    )
                    await worker.runs.wait_ended()
                continue
            with anyio.move_on_after(self._interval):
                await worker.wait_changed()  # a drain finished: report it promptly

    async def _check_namespace(self, worker: Worker, response: HeartbeatResponse) -> bool:
        """On joining, and whenever a shard is granted that the last answer did not
        grant: does this worker's Redis hold the coordinator's namespace id? If not,
        stop reading and raise ``NamespaceMismatchError`` (``redis/namespace.py``):
        reading nothing while looking healthy is worse. False: this Redis could not
        be asked, so the answer is not applied (the lease is not renewed on it)."""
        if response.status in _DROP_ALL:
            return True  # grants nothing
        granted = frozenset(g.shard for g in response.assigned)
        last = self._namespace
        if last is not None and last[0] == response.namespace_id and granted <= last[1]:
            self._namespace = (last[0], granted)
            return True
        check = NamespaceCheck(worker.redis, worker.keyspace, self.settings.redis_url)
        try:
            await check.verify(
                response.namespace_id,
                coordinator=where(self.client),
                coordinator_prefix=response.key_prefix,
            )
        except NamespaceMismatchError as e:
            worker.lease.expire()
            worker.drop_shards()
            log.error("%s", e)
            # Leave, so the coordinator does not wait a lease for this member's shards.
            self.epoch = response.member_epoch
            with anyio.move_on_after(5, shield=True):
                await self.leave(worker)
            self.epoch = 0
            raise
        except (RedisError, OSError) as e:
            log.warning("namespace check failed (%s): answer not applied", e)
            return False
        self._namespace = (response.namespace_id, granted)
        return True

    def _apply(self, worker: Worker, response: HeartbeatResponse, sent: float) -> None:
        self.status = response.status
        self._interval = response.heartbeat_interval_ms / 1000
        if response.status in _DROP_ALL:
            log.warning(
                "member %s %s: dropping all shards (cancelling their runs) and rejoining",
                worker.member_id[:8],
                response.status,
            )
            worker.lease.expire()
            worker.drop_shards()
            self.epoch = 0
            self._full = True
            history.answered(worker, response, {})
            return
        if response.key_prefix != worker.keyspace.prefix:
            log.error(
                "coordinator uses key prefix %r but this worker %r: not reading anything",
                response.key_prefix,
                worker.keyspace.prefix,
            )
            return
        self.epoch = response.member_epoch
        self.metadata_version = response.metadata_version
        self._full = False
        ttl = response.lease_ttl_ms / 1000
        margin = max(self._interval, self.settings.heartbeat_interval)
        worker.lease.renew_after_heartbeat(sent, ttl, margin)
        grants = self._accepted_grants(worker, response)
        revoke = {ShardId.parse(s) for s in response.revoke}
        worker.start_drain(revoke)
        # Shards we read that the coordinator neither grants nor revokes are no longer
        # ours (e.g. they moved while our lease had expired): stop at once.
        lost = [
            s
            for s in worker.owned_shards()
            if s not in grants and s not in revoke and s not in worker.revoking
        ]
        if lost:
            log.info("no longer owns %s (moved while its lease had lapsed)", _names(lost))
            worker.drop_shards(lost)
        worker.apply_assignment(grants)
        history.answered(worker, response, worker.applied(grants))

    def _accepted_grants(self, worker: Worker, response: HeartbeatResponse) -> dict[ShardId, str]:
        """The grants to read under (shard -> fence token), without any whose token is
        below one this member held for the shard: a handler's ``ctx.fencing_token``
        never goes down. A refused grant is reported as fenced, so the coordinator
        re-grants it under a fresh (higher) token."""
        grants: dict[ShardId, str] = {}
        for grant in response.assigned:
            shard = ShardId.parse(grant.shard)
            highest = self._highest.get(shard, 0)
            if grant.epoch < highest:
                self.refused_grants += 1
                log.error(
                    "member %s: refused the grant of %s under token %d, below %d held "
                    "before (Redis lost writes?); asking for a fresh grant",
                    worker.member_id[:8],
                    shard,
                    grant.epoch,
                    highest,
                )
                worker.fenced.add(shard)
                continue
            self._highest[shard] = grant.epoch
            grants[shard] = f"{grant.epoch}:{worker.member_id}"
        return grants

    async def leave(self, worker: Worker) -> None:
        """Send epoch -1 so the shards move at once (graceful shutdown)."""
        if self.epoch <= 0:
            return
        try:
            await self.client.heartbeat(worker.group, self._request(worker, -1))
            log.info("member %s left group %s", worker.member_id[:8], worker.group)
        except CoordinatorError as e:
            log.warning("leave failed (%s); the lease will expire instead", e)


def _names(shards: list[ShardId]) -> str:
    return ", ".join(sorted(str(s) for s in shards))

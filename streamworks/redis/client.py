"""Redis client factory: redis-py asyncio with hiredis, configured for streams.

Two settings matter for correctness, not just speed:

* The socket timeout stays well above any ``BLOCK`` streamworks issues. redis-py 8
  defaults to 5 s and *re-sends* a command that timed out, which for a consumer
  read would orphan the first reply's entries in the pending list.
* Automatic retries are off. A re-sent ``XREADGROUP`` or ``XADD`` after a lost reply
  is not harmless; the reader and producer handle connection errors themselves
  (the reader re-claims its own pending entries, see ``runtime/reader.py``).
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis as sync_redis
from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode, ClusterPipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from streamworks.redis.redis_py import reload_slot_map
from streamworks.settings import Settings

__all__ = (
    "RedisClient",
    "WaitingRedisCluster",
    "create_redis",
    "detect_cluster",
    "is_cluster",
    "masked_url",
    "pool_size",
    "seed_urls",
)

log = logging.getLogger("streamworks.redis")

#: What streamworks accepts as a client: a single server or a cluster.
RedisClient = Redis | RedisCluster

#: Seconds of slack kept between the longest BLOCK and the socket timeout.
_TIMEOUT_MARGIN = 5.0


#: Set while a task runs a command under a permit of :class:`WaitingRedisCluster`: the
#: commands redis-py sends from inside one (a pipeline's redirected retries) reuse it.
_HOLDING: ContextVar[bool] = ContextVar("streamworks_cluster_permit", default=False)


class WaitingRedisCluster(RedisCluster):
    """A cluster client that *waits* for a connection when all are in use.

    redis-py's cluster client raises ``MaxConnectionsError`` when a node's
    ``max_connections`` are taken, where the single-node client's blocking pool waits.
    Here every command and pipeline holds one permit of ``max_connections`` for its
    duration, and uses at most one connection per node, so no node's pool is ever
    exhausted: a burst (a thousand heartbeats at once, many idle shards waiting) queues
    instead of failing.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_connections = int(kwargs.get("max_connections") or 1024)
        self._permits = asyncio.Semaphore(self.max_connections)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if _HOLDING.get():
            return await super().execute_command(*args, **kwargs)
        async with self._permits:
            token = _HOLDING.set(True)
            try:
                return await super().execute_command(*args, **kwargs)
            finally:
                _HOLDING.reset(token)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # redis-py's error
        return _WaitingPipeline(self, transaction)  # type: ignore[abstract]


class _WaitingPipeline(ClusterPipeline):
    """A cluster pipeline holding one permit of its client while it executes.

    It also marks the slot map for a refresh when a node cannot be reached: redis-py's
    cluster pipeline does so only on its way to a retry, and streamworks' clients do
    not retry, so without this a pipeline would keep sending to a dead master after
    its replica took over (single commands refresh by themselves).
    """

    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        client = self.cluster_client
        if _HOLDING.get() or not isinstance(client, WaitingRedisCluster):
            return await self._execute_refreshing(raise_on_error, allow_redirections)
        async with client._permits:
            token = _HOLDING.set(True)
            try:
                return await self._execute_refreshing(raise_on_error, allow_redirections)
            finally:
                _HOLDING.reset(token)

    async def _execute_refreshing(self, raise_on_error: bool, redirections: bool) -> list[Any]:
        try:
            replies = await super().execute(raise_on_error, redirections)
        except RedisCluster.ERRORS_ALLOW_RETRY:
            reload_slot_map(self.cluster_client)  # the next command reloads the slot map
            raise
        if any(isinstance(r, RedisCluster.ERRORS_ALLOW_RETRY) for r in replies):
            reload_slot_map(self.cluster_client)  # a reply lost with its connection
        return list(replies)


def pool_size(redis: Any) -> int | None:
    """How many connections ``redis`` opens at most (None: not a client made by
    :func:`create_redis`, or its pool does not say)."""
    if isinstance(redis, WaitingRedisCluster):
        return redis.max_connections
    pool = getattr(redis, "connection_pool", None)
    size = getattr(pool, "max_connections", None)
    return size if isinstance(size, int) and size > 0 else None


def is_cluster(redis: Any) -> bool:
    """Whether ``redis`` is a Redis Cluster client."""
    return isinstance(redis, RedisCluster)


def seed_urls(url: str) -> list[str]:
    """The URLs in ``redis_url``: one, or several separated by commas — the seed nodes
    of a Redis Cluster, so that a client starts while one of them is down (only the
    host and port of the later ones are used; user, password, TLS and timeouts come
    from the first)."""
    urls = [u.strip() for u in url.split(",") if u.strip()]
    if not urls:
        raise ValueError("no Redis URL given")
    return urls


def detect_cluster(url: str, *, timeout: float = 5.0) -> bool:
    """Whether the server at ``url`` runs in cluster mode (``CLUSTER INFO`` answers).
    With several seed URLs (:func:`seed_urls`) the first that answers decides.

    A server without cluster support answers ``CLUSTER INFO`` with an error, as does
    one whose ACL does not grant it (the role ACLs of ``streamworks admin acl`` grant
    it, and a refusal is logged); both mean the single-node client. An unreachable
    server is taken as a single node, silently: the caller's first command fails with
    the real error. Set ``redis_cluster`` to say which explicitly. This runs once, when
    a client is created (one round trip, before any traffic).
    """
    urls = seed_urls(url)
    if len(urls) > 1:
        for seed in urls:
            try:
                return _probe(seed, timeout, quiet_unreachable=False)
            except (sync_redis.ConnectionError, sync_redis.TimeoutError):
                continue  # a seed node down or not answering: ask the next
        return True  # none answers: several URLs name a cluster's seeds; commands will say
    return _probe(urls[0], timeout, quiet_unreachable=True)


def _probe(url: str, timeout: float, *, quiet_unreachable: bool) -> bool:
    if url.startswith("unix:"):
        return False  # cluster nodes are TCP only
    probe = sync_redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=None, driver_info=None
    )
    try:
        probe.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
    except sync_redis.exceptions.NoPermissionError:
        log.warning(
            "the Redis user may not run CLUSTER INFO, so whether the server is a cluster "
            "is unknown; using the single-node client (grant +cluster|info, or set "
            "STREAMWORKS_REDIS_CLUSTER=true or false)"
        )
        return False
    except sync_redis.ResponseError:
        return False
    except (sync_redis.ConnectionError, sync_redis.TimeoutError):
        # Unreachable: the caller's first command reports that (one clear error); a
        # process that must start before its cluster answers sets redis_cluster=true.
        if quiet_unreachable:
            return False
        raise
    except sync_redis.RedisError:
        return False
    finally:
        probe.close()
    return True


def create_redis(settings: Settings, *, max_connections: int = 1024) -> Any:
    """Create an asyncio client for ``settings.redis_url`` (``redis://``, ``rediss://``,
    ``unix://``): a cluster client when ``settings.redis_cluster`` is true, or when it
    is unset (auto) and the server says it runs in cluster mode (:func:`detect_cluster`).

    The pool *waits* for a free connection instead of failing when all are in use
    (redis-py's default pool raises at 100; on a cluster, see
    :class:`WaitingRedisCluster`). A worker holds one connection per idle
    shard it owns (the blocking wait for new entries); connections are opened lazily,
    so a large limit costs nothing until used.
    """
    options: dict[str, Any] = {
        "socket_timeout": settings.worker.block + _TIMEOUT_MARGIN,
        "socket_connect_timeout": 5.0,
        "decode_responses": False,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 30,
        # No CLIENT SETINFO on connect: it does not exist before Redis 7.2, and the
        # least-privilege role users (redis/acl.py) are not granted it, so every new
        # connection would add a refusal to the server's ACL LOG.
        "driver_info": None,
    }
    urls = seed_urls(settings.redis_url)
    cluster = settings.redis_cluster
    if cluster is None:
        cluster = detect_cluster(settings.redis_url)
    if cluster:
        options.pop("health_check_interval")
        # The later seeds join the first's: redis-py asks them in turn for the slot map
        # (with the first URL's credentials and TLS) until one answers.
        seeds = [ClusterNode(*_host_port(u)) for u in urls[1:]]
        return WaitingRedisCluster.from_url(
            urls[0], max_connections=max_connections, startup_nodes=seeds or None, **options
        )
    if len(urls) > 1:
        raise ValueError(
            f"{len(urls)} Redis URLs given, but the server is not a Redis Cluster (several "
            "URLs are a cluster's seed nodes): give one URL, or set redis_cluster=true"
        )
    pool = BlockingConnectionPool.from_url(
        urls[0], max_connections=max_connections, timeout=10, **options
    )
    return Redis.from_pool(pool)  # the client owns the pool: aclose() closes it


def masked_url(url: str) -> str:
    """``url`` with any password masked (URLs are printed; secrets never are); each of
    a cluster's comma-separated seed URLs."""
    if "," in url:
        return ",".join(masked_url(u) for u in url.split(","))
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"a cluster seed URL needs a host: {url.split('@')[-1]!r}")
    return parts.hostname, parts.port or 6379

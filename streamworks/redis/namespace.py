"""Namespace identity: proof that a member and its coordinator share one keyspace.

A worker or producer pointed at another Redis (another database, another server) or
another key prefix than its coordinator would otherwise join, be granted shards, and
read nothing — the shard keys the coordinator names do not exist where it looks. So
the coordinator writes a random *namespace id* once (``SET NX`` on
``Keyspace.namespace()``, in the control-plane slot) and returns it in every
heartbeat and routing answer (``namespaceId``); the member checks that the same key
in *its own* Redis, under *its own* prefix, holds the same id — when it joins, and
again whenever the coordinator grants a new shard or a routing table is fetched. A
missing or different id is a :class:`NamespaceMismatchError` naming both sides.
"""

from __future__ import annotations

import uuid
from typing import Any

from redis.exceptions import NoPermissionError

from streamworks.exceptions import NamespaceMismatchError
from streamworks.redis.client import masked_url
from streamworks.redis.keyspace import Keyspace

__all__ = ("NamespaceCheck", "claim_namespace", "read_namespace", "where")


async def claim_namespace(redis: Any, keyspace: Keyspace) -> str:
    """The namespace id of ``keyspace`` in ``redis``, created if there is none yet
    (``SET NX``: every coordinator replica ends up with the same one)."""
    key = keyspace.namespace()
    await redis.set(key, uuid.uuid4().hex, nx=True)
    value = await read_namespace(redis, keyspace)
    if value is None:  # deleted between the two commands: try once more
        await redis.set(key, uuid.uuid4().hex, nx=True)
        value = await read_namespace(redis, keyspace)
    if value is None:
        raise NamespaceMismatchError(f"cannot create the namespace id {key!r}")
    return value


async def read_namespace(redis: Any, keyspace: Keyspace) -> str | None:
    """The namespace id ``redis`` holds under ``keyspace``'s prefix, or None."""
    value = await redis.get(keyspace.namespace())
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class NamespaceCheck:
    """Checks a coordinator's namespace id against this process's Redis and prefix.

    Args:
        redis: this process's client (the one it reads or publishes with).
        keyspace: this process's keyspace.
        redis_url: its URL, for the error message (a password is masked).
    """

    def __init__(self, redis: Any, keyspace: Keyspace, redis_url: str) -> None:
        self.redis = redis
        self.keyspace = keyspace
        self.redis_url = masked_url(redis_url)
        self.checks = 0

    async def verify(
        self,
        expected: str | None,
        *,
        coordinator: str,
        coordinator_prefix: str | None = None,
    ) -> None:
        """Raise :class:`NamespaceMismatchError` unless this Redis holds ``expected``.

        Args:
            expected: the id the coordinator sent (None: it sent none).
            coordinator: where the answer came from (for the message).
            coordinator_prefix: the coordinator's key prefix, when it said.
        """
        self.checks += 1
        theirs = f"key prefix {coordinator_prefix!r}" if coordinator_prefix else "its key prefix"
        if expected is None:
            raise NamespaceMismatchError(
                f"coordinator {coordinator} sent no namespace id (an older version?): "
                "cannot prove it serves this process's Redis and key prefix"
            )
        try:
            found = await read_namespace(self.redis, self.keyspace)
        except NoPermissionError:
            # A least-privilege user (redis/acl.py) made for another key prefix: it may
            # not even look, which is as good as holding none here.
            found, denied = None, True
        else:
            denied = False
        if found == expected:
            return
        held = "no namespace id" if found is None else f"namespace {found}"
        if denied:
            held += " it may read (its Redis user is refused the key: an ACL for another prefix?)"
        # Two causes look alike from here: the wrong Redis (or prefix), or the right
        # one after it lost its data under a running coordinator, which then says so
        # itself (coordinator/identity.py). The advice names both.
        lost = (
            "that Redis lost its data (restarted without persistence?)"
            if found is None
            else "the coordinator is stale: that Redis lost its data and another replica "
            "created a new namespace"
        )
        raise NamespaceMismatchError(
            f"namespace mismatch: coordinator {coordinator} serves namespace {expected} "
            f"({theirs}), but this process's Redis {self.redis_url} holds {held} under "
            f"key prefix {self.keyspace.prefix!r} ({self.keyspace.namespace()}): use the "
            f"coordinator's Redis URL, database and key prefix; if they are right, {lost}: "
            "the coordinator's log, status and /readyz say so; restart its replicas, then "
            "this process"
        )


def where(transport: Any) -> str:
    """The coordinator a transport reaches, for messages: its URLs (HTTP client) or
    ``in-process`` (``TestRuntime``'s transport)."""
    urls = getattr(transport, "urls", None)
    return ", ".join(urls) if urls else "in-process"

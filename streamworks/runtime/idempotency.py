"""Explicit idempotency hooks (E23).

streamworks delivers at least once (E22); preventing duplicate side effects is the
application's job. A handler declared with ``idempotency_key=`` gets help: before the
handler runs, the key is *claimed* in an :class:`IdempotencyStore`; after success it is
*completed*; on failure it is *released* so a retry can claim it again. A message
whose key is already completed is acked and counted as a duplicate without calling
the handler. ``ctx.idempotency_key`` carries the key into the handler so it can also
go into the application's own transaction or unique constraint, the only place where
"exactly once" side effects can really be enforced.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from streamworks.redis.keyspace import Keyspace

__all__ = ("IdempotencyStore", "RedisIdempotencyStore")


@runtime_checkable
class IdempotencyStore(Protocol):
    """Where idempotency keys are claimed and completed."""

    async def claim(self, key: str, ttl: float, holder: str) -> bool:
        """Claim ``key`` for ``ttl`` seconds on behalf of ``holder`` (the message,
        ``"<shard>/<entry id>"``).

        Returns True when the key was free or is already claimed by the same holder
        (the same entry redelivered after its previous owner crashed: ownership of a
        shard is exclusive, so that earlier attempt is over); False when it is
        completed or claimed by another message.
        """
        ...

    async def complete(self, key: str) -> None:
        """Mark ``key`` done: later messages with it are duplicates."""
        ...

    async def release(self, key: str) -> None:
        """Give a claim up (the handler failed; a retry may claim again)."""
        ...

    async def is_completed(self, key: str) -> bool:
        """Whether ``key`` was completed (as opposed to merely claimed)."""
        ...


_PENDING = b"pending:"
_DONE = b"done"


class RedisIdempotencyStore:
    """The default store: one Redis string per key, ``SET NX PX`` to claim.

    Completed keys are kept for ``completed_ttl`` seconds, the window within which
    duplicates are recognised.
    """

    def __init__(
        self, redis: Any, keyspace: Keyspace, group: str, *, completed_ttl: float = 86_400.0
    ) -> None:
        self._redis = redis
        self._keyspace = keyspace
        self._group = group
        self._completed_ms = int(completed_ttl * 1000)

    def _key(self, key: str) -> str:
        return self._keyspace.idempotency(self._group, key)

    async def claim(self, key: str, ttl: float, holder: str) -> bool:
        name = self._key(key)
        ms = int(ttl * 1000)
        value = _PENDING + holder.encode()
        if await self._redis.set(name, value, nx=True, px=ms):
            return True
        if await self._redis.get(name) == value:
            await self._redis.pexpire(name, ms)
            return True
        return False

    async def complete(self, key: str) -> None:
        await self._redis.set(self._key(key), _DONE, px=self._completed_ms)

    async def release(self, key: str) -> None:
        # Only a pending claim is released; a completed key stays completed.
        name = self._key(key)
        current = await self._redis.get(name)
        if current is not None and current.startswith(_PENDING):
            await self._redis.delete(name)

    async def is_completed(self, key: str) -> bool:
        return bool(await self._redis.get(self._key(key)) == _DONE)

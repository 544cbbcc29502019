"""Key placement of the routing protocol ``jump-xxh64-v1``, shared by every side.

A keyed message goes to shard ``jump_hash(key_hash(key), shard_count)`` of the
stream's routable shards, in index order: **jump consistent hashing** over the
xxHash64 of the key, so the same protocol, shard count and key always give the same
shard (E17), and growing from N to N+1 shards moves only about 1/(N+1) of the keys.

It lives in the protocol because it is one: producers (``runtime/routing.py``) and
whoever replays a dead letter to the key's current shard (``streamworks.dlq``, used
by the CLI and by the coordinator's dashboard) must place a key the same way.
"""

from __future__ import annotations

import xxhash

__all__ = ("ROUTING_PROTOCOL", "jump_hash", "key_hash")

#: The routing protocol implemented here.
ROUTING_PROTOCOL = "jump-xxh64-v1"

_MASK64 = 0xFFFFFFFFFFFFFFFF


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash (Lamping & Veach, 2014) of a 64-bit key into ``buckets``."""
    if buckets <= 0:
        raise ValueError("buckets must be positive")
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _MASK64
        j = int((b + 1) * (2147483648.0 / ((key >> 33) + 1)))
    return b


def key_hash(key: str | bytes) -> int:
    """xxHash64 (seed 0) of the key's UTF-8 bytes."""
    return xxhash.xxh64_intdigest(key.encode() if isinstance(key, str) else key)

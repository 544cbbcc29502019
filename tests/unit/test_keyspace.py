"""Keyspace glob patterns match exactly the key families they name (Redis' SCAN and
ACL globs treat ``{``, ``}``, ``:`` and ``/`` literally, as ``fnmatchcase`` does)."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace

KEYS = Keyspace("app-1")
SHARD = ShardId("orders", 3, 2)


def every_key(ks: Keyspace) -> dict[str, str]:
    return {
        "stream": ks.stream(SHARD),
        "fence": ks.fence(SHARD, "g"),
        "retries": ks.retries(SHARD, "g"),
        "dedup": ks.dedup(SHARD, "evt-1"),
        "dead_letters": ks.dead_letters("g", "orders"),
        "dead_letter_marker": ks.dead_letter_marker("g", "orders", ks.stream(SHARD), "1-0"),
        "dead_letter_markers": ks.dead_letter_markers("g", "orders"),
        "read_hold": ks.read_hold(SHARD),
        "lag_repair_turn": ks.lag_repair_turn("orders"),
        "idempotency": ks.idempotency("g", "k:1"),
        "group_meta": ks.group_meta("g"),
        "group_mutex": ks.group_mutex("g"),
        "group_leases": ks.group_leases("g"),
        "stream_meta": ks.stream_meta("orders"),
        "stream_mutex": ks.stream_mutex("orders"),
        "registry_streams": ks.registry_streams(),
        "registry_groups": ks.registry_groups(),
        "registry_subscriptions": ks.registry_subscriptions("orders"),
        "epoch_floor": ks.epoch_floor(),
        "status": ks.status(),
    }


def matching(pattern: str) -> set[str]:
    return {name for name, key in every_key(KEYS).items() if fnmatchcase(key, pattern)}


def test_family_patterns_match_their_family_only() -> None:
    shard_slot = {"stream", "fence", "retries", "dedup", "read_hold"}
    assert matching(KEYS.shard_slot_pattern()) == shard_slot
    assert matching(KEYS.shard_streams_pattern()) == {"stream"}
    assert matching(KEYS.fences_pattern()) == {"fence"}
    assert matching(KEYS.retries_pattern()) == {"retries"}
    assert matching(KEYS.read_holds_pattern()) == {"read_hold"}
    assert matching(KEYS.dedup_pattern()) == {"dedup"}
    assert matching(KEYS.dead_letters_pattern()) == {"dead_letters"}
    markers = {"dead_letter_marker", "dead_letter_markers"}
    assert matching(KEYS.dead_letter_marker_pattern()) == markers
    assert matching(KEYS.idempotency_pattern()) == {"idempotency"}
    per_group = {"dead_letters", "idempotency", *markers}
    control = set(every_key(KEYS)) - shard_slot - per_group
    assert matching(KEYS.control_pattern()) == control


def test_namespace_patterns_cover_every_key_and_no_other_prefix() -> None:
    patterns = KEYS.namespace_patterns()
    for name, key in every_key(KEYS).items():
        assert any(fnmatchcase(key, p) for p in patterns), name
    # A prefix that starts with this one is another namespace.
    for name, key in every_key(Keyspace("app-10")).items():
        assert not any(fnmatchcase(key, p) for p in patterns), name


def test_a_dead_letter_key_parses_back_to_its_group_and_stream() -> None:
    keys = Keyspace("app")
    key = keys.dead_letters("billing", "orders")
    assert keys.dead_letters_of(key) == ("billing", "orders")
    assert fnmatchcase(key, keys.dead_letters_pattern())
    with pytest.raises(ValueError, match="not a dead-letter stream"):
        Keyspace("app-1").dead_letters_of(key)
    with pytest.raises(ValueError, match="not a dead-letter stream"):
        keys.dead_letters_of(keys.stream(ShardId("orders", 0, 0)))

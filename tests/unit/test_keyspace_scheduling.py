"""The new key families (delayed messages, schedules, rate-limit buckets): which slot
each lands in, and that their patterns match them and nothing else."""

from __future__ import annotations

from fnmatch import fnmatchcase

from redis.cluster import key_slot

from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace

KEYS = Keyspace("app-1")
SHARD = ShardId("orders", 3, 2)
SCHED = KEYS.schedule_shard(4)


def slot(key: str) -> int:
    return int(key_slot(key.encode()))


def new_keys(ks: Keyspace) -> dict[str, str]:
    sched = ks.schedule_shard(4)
    return {
        "delayed": ks.delayed(SHARD),
        "delayed_entries": ks.delayed_entries(SHARD),
        "delayed_counter": ks.delayed_counter(SHARD),
        "delayed_wake": ks.delayed_wake(SHARD),
        "schedule_state": ks.schedule_state(sched, "billing", "hourly"),
        "schedules": ks.schedules(sched, "billing"),
        "rate_bucket": ks.rate_bucket("billing", "orders"),
        "rate_key_bucket": ks.rate_key_bucket("billing", "orders", "customer-{7}"),
    }


def old_keys(ks: Keyspace) -> dict[str, str]:
    return {
        "stream": ks.stream(SHARD),
        "fence": ks.fence(SHARD, "g"),
        "dedup": ks.dedup(SHARD, "e"),
        "retries": ks.retries(SHARD, "g"),
        "redelivery": ks.redelivery(SHARD, "g"),
        "dead_letters": ks.dead_letters("g", "orders"),
        "idempotency": ks.idempotency("g", "k"),
        "group_meta": ks.group_meta("g"),
    }


def test_delayed_keys_share_the_shards_slot() -> None:
    stream = slot(KEYS.stream(SHARD))
    for name in ("delayed", "delayed_entries", "delayed_counter", "delayed_wake"):
        assert slot(new_keys(KEYS)[name]) == stream, name
    assert slot(KEYS.dedup(SHARD, "ev")) == stream  # delay_add's dedup record


def test_schedule_state_shares_the_schedule_shards_fence_slot() -> None:
    fence = slot(KEYS.fence(SCHED, "billing"))
    assert ShardId(Keyspace.SCHEDULE_STREAM, 0, 4) == SCHED
    assert slot(KEYS.schedule_state(SCHED, "billing", "hourly")) == fence
    assert slot(KEYS.schedules(SCHED, "billing")) == fence


def test_a_handlers_buckets_share_one_slot_whatever_the_key() -> None:
    bucket = slot(KEYS.rate_bucket("billing", "orders"))
    for key in ("a", "b", "{x}", "}{", "long" * 50):
        assert slot(KEYS.rate_key_bucket("billing", "orders", key)) == bucket


def test_new_patterns_match_their_family_only() -> None:
    every = {**new_keys(KEYS), **old_keys(KEYS)}

    def matching(pattern: str) -> set[str]:
        return {n for n, k in every.items() if fnmatchcase(k, pattern)}

    assert matching(KEYS.delayed_pattern()) == {
        "delayed",
        "delayed_entries",
        "delayed_counter",
        "delayed_wake",
    }
    assert matching(KEYS.schedule_pattern()) == {"schedule_state", "schedules"}
    assert matching(KEYS.rate_pattern()) == {"rate_bucket", "rate_key_bucket"}
    # Shard-slot keys stay under the shard-slot pattern (the worker's and producer's
    # ACL root); rate buckets do not (they get a selector of their own).
    shard_slot = matching(KEYS.shard_slot_pattern())
    assert {"delayed", "delayed_entries", "delayed_counter", "schedule_state"} <= shard_slot
    assert not {"rate_bucket", "rate_key_bucket"} & shard_slot


def test_namespace_patterns_cover_the_new_keys_and_no_other_prefix() -> None:
    patterns = KEYS.namespace_patterns()
    for name, key in new_keys(KEYS).items():
        assert any(fnmatchcase(key, p) for p in patterns), name
    for name, key in new_keys(Keyspace("app-10")).items():
        assert not any(fnmatchcase(key, p) for p in patterns), name


def test_a_delayed_key_parses_back_to_its_shard() -> None:
    assert KEYS.shard_of(KEYS.delayed(SHARD)) == SHARD
    assert KEYS.shard_of(KEYS.schedule_state(SCHED, "g", "s")) == SCHED

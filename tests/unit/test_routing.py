"""Jump consistent hashing over xxHash64 (``jump-xxh64-v1``) and routing tables."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamworks.exceptions import NoShardsError
from streamworks.protocol.shards import ShardId
from streamworks.runtime.routing import RoutingTable, ShardRoute, jump_hash, key_hash


def table(n: int, version: int = 1) -> RoutingTable:
    return RoutingTable(
        "orders", version, [ShardRoute(ShardId("orders", i), f"k{i}") for i in range(n)]
    )


# Output of the reference C++ implementation (Lamping & Veach 2014, Figure 1),
# compiled with g++ for these keys and bucket counts: pins the routing protocol.
REFERENCE = {
    0: [0, 0, 0, 0, 0, 0],
    1: [0, 0, 6, 6, 55, 549],
    42: [0, 1, 2, 2, 43, 571],
    0xDEADBEEF: [0, 1, 5, 5, 87, 285],
    2**64 - 1: [0, 1, 2, 7, 92, 313],
    1234567890123456789: [0, 1, 3, 3, 96, 888],
}


@pytest.mark.parametrize(("key", "expected"), REFERENCE.items())
def test_jump_hash_matches_reference(key: int, expected: list[int]) -> None:
    assert [jump_hash(key, n) for n in (1, 2, 7, 8, 100, 1000)] == expected


def test_key_hash_is_xxh64_seed_0() -> None:
    assert key_hash(b"") == 0xEF46DB3751D8E999  # published XXH64("") test vector
    assert key_hash("customer-42") == key_hash(b"customer-42")


@given(st.integers(min_value=0, max_value=2**64 - 1), st.integers(min_value=1, max_value=512))
def test_jump_hash_in_range_and_monotone(key: int, n: int) -> None:
    # The defining property: growing from n to n+1 buckets either keeps a key where it
    # was or moves it to the new bucket n, never between old buckets.
    a, b = jump_hash(key, n), jump_hash(key, n + 1)
    assert 0 <= a < n
    assert b in (a, n)


@pytest.mark.seed("E17")
def test_same_protocol_count_and_key_give_the_same_shard() -> None:
    keys = [f"customer-{i}" for i in range(2000)]
    first = [table(8).route(k).shard for k in keys]
    again = [table(8, version=9).route(k).shard for k in keys]  # another table, same layout
    assert first == again
    moved = sum(
        a.index != b.shard.index for a, b in zip(first, map(table(9).route, keys), strict=True)
    )
    assert moved > 0  # a different shard count is a different routing domain


@pytest.mark.parametrize("n", [1, 4, 8, 16])
def test_distribution_is_even(n: int) -> None:
    counts = collections.Counter(jump_hash(key_hash(f"k{i}"), n) for i in range(80_000))
    expected = 80_000 / n
    chi2 = sum((counts[b] - expected) ** 2 / expected for b in range(n))
    # 99.9th percentile of chi-square with n-1 <= 15 degrees of freedom is < 38.
    assert chi2 < 38, counts


@pytest.mark.parametrize("n", [1, 3, 8, 31])
def test_growing_by_one_moves_about_one_in_n_plus_one(n: int) -> None:
    keys = [key_hash(f"user:{i}") for i in range(60_000)]
    moved = sum(jump_hash(k, n) != jump_hash(k, n + 1) for k in keys) / len(keys)
    assert abs(moved - 1 / (n + 1)) < 0.015


@pytest.mark.seed("E14")
def test_zero_shards_raise_no_shards_error() -> None:
    with pytest.raises(NoShardsError, match="0 shards"):
        table(0).route("k")
    with pytest.raises(NoShardsError):
        table(0).route(None)


def test_unkeyed_messages_stick_then_rotate_over_every_shard() -> None:
    t = table(4)
    picks = [t.route(None, sticky_batch=10).shard.index for _ in range(80)]
    runs = [picks[i : i + 10] for i in range(0, 80, 10)]
    assert all(len(set(run)) == 1 for run in runs)  # sticky within a batch
    assert set(picks) == {0, 1, 2, 3}  # and every shard gets its turn
    assert all(runs[i][0] != runs[i + 1][0] for i in range(7))

"""fence.lua: monotonic owner-fence write.

Contract: {1, token} written (or already equal) | {0, current} refused | {-2} the
shard does not exist (nothing written).
"""

from __future__ import annotations

from typing import Any

import pytest

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import set_key, shard

STREAM_KEY: dict[str, str] = {}  # fence key -> its shard's stream key


async def write(scripts: Scripts, key: str, epoch: int, member: str) -> list[Any]:
    return await scripts.fence(keys=[key, STREAM_KEY[key]], args=[epoch, member])


@pytest.fixture
async def fence_key(redis: Any, scripts: Scripts, keyspace: Keyspace) -> str:
    """The fence key of a shard that exists."""
    key = keyspace.fence(shard(), "billing")
    STREAM_KEY[key] = keyspace.stream(shard())
    assert (
        await scripts.shard_create(
            keys=[STREAM_KEY[key], set_key(STREAM_KEY[key])], args=["sealed", "billing"]
        )
        == 1
    )
    return key


async def test_a_retired_shard_gets_no_fence(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    """A grant racing with the shard's retirement leaves no orphan fence key."""
    key = keyspace.fence(shard(), "billing")
    STREAM_KEY[key] = keyspace.stream(shard())  # never created (or retired)
    assert await write(scripts, key, 3, "m-1") == [-2]
    assert await redis.exists(key) == 0


async def test_writes_when_absent(redis: Any, scripts: Scripts, fence_key: str) -> None:
    assert await write(scripts, fence_key, 3, "m-1") == [1, b"3:m-1"]
    assert await redis.get(fence_key) == b"3:m-1"


async def test_rewriting_the_same_token_is_accepted(
    redis: Any, scripts: Scripts, fence_key: str
) -> None:
    await redis.set(fence_key, "3:m-1")
    assert await write(scripts, fence_key, 3, "m-1") == [1, b"3:m-1"]
    assert await redis.get(fence_key) == b"3:m-1"


@pytest.mark.parametrize(
    ("current", "epoch"),
    [
        pytest.param("3:m-1", 4, id="next-epoch"),
        pytest.param("9:m-1", 10, id="more-digits"),  # 10 > 9 numerically, not as text
        pytest.param("3:m-1", 1000, id="far-newer"),
    ],
)
async def test_newer_epoch_replaces(
    redis: Any, scripts: Scripts, fence_key: str, current: str, epoch: int
) -> None:
    await redis.set(fence_key, current)
    assert await write(scripts, fence_key, epoch, "m-2") == [1, f"{epoch}:m-2".encode()]
    assert await redis.get(fence_key) == f"{epoch}:m-2".encode()


@pytest.mark.parametrize(
    ("current", "epoch", "member"),
    [
        pytest.param("4:m-1", 3, "m-2", id="older-epoch"),
        pytest.param("10:m-1", 9, "m-2", id="older-epoch-fewer-digits"),
        pytest.param("4:m-1", 3, "m-1", id="older-epoch-same-member"),
        pytest.param("4:m-1", 4, "m-2", id="equal-epoch-other-member"),
    ],
)
async def test_refuses_an_older_or_equal_epoch_and_returns_the_current_fence(
    redis: Any, scripts: Scripts, fence_key: str, current: str, epoch: int, member: str
) -> None:
    await redis.set(fence_key, current)
    assert await write(scripts, fence_key, epoch, member) == [0, current.encode()]
    assert await redis.get(fence_key) == current.encode()


async def test_sequence_of_grants_never_goes_backwards(
    redis: Any, scripts: Scripts, fence_key: str
) -> None:
    grants = [(1, "a"), (3, "b"), (2, "a"), (3, "c"), (3, "b"), (12, "c"), (11, "a")]
    accepted = [(await write(scripts, fence_key, e, m))[0] for e, m in grants]
    assert accepted == [1, 1, 0, 0, 1, 1, 0]
    assert await redis.get(fence_key) == b"12:c"

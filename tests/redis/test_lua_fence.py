"""fence.lua: monotonic owner-fence write.

Contract: {1, fence} written (or already equal) | {0, current} refused (a newer or equal
token of another member, or one the writer's metadata never recorded) | {2, current} a
newer grant to the same member holds | {-2} the shard does not exist (nothing written).
"""

from __future__ import annotations

from typing import Any

import pytest

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

from .streams import set_key, shard

STREAM_KEY: dict[str, str] = {}  # fence key -> its shard's stream key


async def write(
    scripts: Scripts, key: str, token: int, member: str, known: int | None = None
) -> list[Any]:
    args: list[Any] = [token, member] if known is None else [token, member, known]
    return await scripts.fence(keys=[key, STREAM_KEY[key]], args=args)


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
        pytest.param("4:m-1", 4, "m-2", id="equal-epoch-other-member"),
        pytest.param("1843200000000001:m-1", 1843200000000000, "m-2", id="older-token-of-2**50"),
    ],
)
async def test_refuses_an_older_or_equal_epoch_and_returns_the_current_fence(
    redis: Any, scripts: Scripts, fence_key: str, current: str, epoch: int, member: str
) -> None:
    await redis.set(fence_key, current)
    assert await write(scripts, fence_key, epoch, member) == [0, current.encode()]
    assert await redis.get(fence_key) == current.encode()


async def test_a_newer_grant_to_the_same_member_is_kept(
    redis: Any, scripts: Scripts, fence_key: str
) -> None:
    """A late write of a member's older grant (a replica that answered slowly) leaves
    the member's newer one in place; nothing is wrong, nothing is written."""
    await redis.set(fence_key, "4:m-1")
    assert await write(scripts, fence_key, 3, "m-1") == [2, b"4:m-1"]
    assert await redis.get(fence_key) == b"4:m-1"


async def test_a_fence_the_metadata_never_issued_refuses_even_a_higher_token(
    redis: Any, scripts: Scripts, fence_key: str
) -> None:
    """Issue 18, finding 4: a fence of another member with a token above every token the
    writer's metadata recorded is a grant Redis lost with the metadata; its owner may
    still run the shard. A higher token does not replace it: the coordinator must know
    (it fences its grantee and quarantines the shards). Without the third argument (an
    older coordinator) only the monotonic rule applies."""
    await redis.set(fence_key, "500:m-1")
    assert await write(scripts, fence_key, 900, "m-2", known=400) == [0, b"500:m-1"]
    assert await redis.get(fence_key) == b"500:m-1"
    # Known to the metadata (issued at or below its last token): replaced.
    assert await write(scripts, fence_key, 900, "m-2", known=500) == [1, b"900:m-2"]
    # The same member's own lost grant is superseded by its new one.
    await redis.set(fence_key, "950:m-2")
    assert await write(scripts, fence_key, 990, "m-2", known=900) == [1, b"990:m-2"]
    await redis.set(fence_key, "995:m-1")
    assert await write(scripts, fence_key, 999, "m-2") == [1, b"999:m-2"]


async def test_sequence_of_grants_never_goes_backwards(
    redis: Any, scripts: Scripts, fence_key: str
) -> None:
    grants = [(1, "a"), (3, "b"), (2, "a"), (3, "c"), (3, "b"), (12, "c"), (11, "a")]
    accepted = [(await write(scripts, fence_key, e, m))[0] for e, m in grants]
    assert accepted == [1, 1, 0, 0, 1, 1, 0]
    assert await redis.get(fence_key) == b"12:c"

"""E12: `lag` in XINFO GROUPS stays exact under everything the runtime does.

The runtime only ever XADDs, XREADGROUPs, XACKs and trims with trim.lua (never XDEL),
and every group is created by shard_create.lua / group_create.lua with ENTRIESREAD.
Under that discipline, on every step, each group's reported lag equals the number of
entries after its last-delivered-id, and is never nil.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.settings import Settings

from .streams import groups, set_key, shard, text

GROUPS = ("fast", "slow")
CONSUMERS = ("c1", "c2")

# One operation: ("add", n) | ("read", group, consumer, count) | ("ack", group, index, n)
# | ("trim", cap index or None). Indexes pick among what exists when the step runs.
Op = tuple[Any, ...]

operations = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 4)),
    st.tuples(
        st.just("read"),
        st.sampled_from(GROUPS),
        st.sampled_from(CONSUMERS),
        st.integers(1, 4),
    ),
    st.tuples(st.just("ack"), st.sampled_from(GROUPS), st.integers(0, 20), st.integers(1, 3)),
    st.tuples(st.just("trim"), st.none() | st.integers(0, 20)),
)


@dataclass
class Model:
    """What the test itself knows: every id added, and each group's deliveries."""

    added: list[str] = field(default_factory=list)
    delivered: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GROUPS, 0))
    pending: dict[str, list[str]] = field(default_factory=lambda: {g: [] for g in GROUPS})

    def undelivered(self, group: str) -> list[str]:
        return self.added[self.delivered[group] :]


async def check(redis: Any, stream: str, model: Model, step: int, op: Op) -> None:
    info = await groups(redis, stream)
    remaining = {text(i) for i, _ in await redis.xrange(stream, "-", "+")}
    for name in GROUPS:
        g = info[name]
        expected = model.undelivered(name)
        last = g["last-delivered-id"]
        after_last = [text(i) for i, _ in await redis.xrange(stream, f"({last}", "+")]
        where = f"step {step} {op!r}, group {name}: {g}"
        assert g["lag"] is not None, f"lag nil at {where}"
        # Nothing undelivered was ever trimmed, and the stream agrees with the model.
        assert after_last == expected, f"undelivered entries lost at {where}"
        assert g["lag"] == len(after_last), f"lag != true lag {len(after_last)} at {where}"
        assert g["pending"] == len(model.pending[name]), where
        assert set(model.pending[name]) <= remaining, f"pending entry trimmed at {where}"


async def run(url: str, prefix: str, ops: list[Op]) -> None:
    settings = Settings(redis_url=url, key_prefix=prefix)
    redis = create_redis(settings)
    scripts = Scripts(redis)
    stream = Keyspace(prefix).stream(shard(f"lag-{uuid.uuid4().hex[:8]}"))
    model = Model()
    try:
        assert (
            await scripts.shard_create(keys=[stream, set_key(stream)], args=["sealed", *GROUPS])
            == 1
        )
        await check(redis, stream, model, -1, ("create",))
        for step, op in enumerate(ops):
            kind = op[0]
            if kind == "add":
                for _ in range(op[1]):
                    model.added.append(text(await redis.xadd(stream, {"s": str(step)})))
            elif kind == "read":
                _, group, consumer, count = op
                reply = await redis.xreadgroup(group, consumer, {stream: ">"}, count=count)
                got = [text(i) for i, _ in reply[0][1]] if reply else []
                start = model.delivered[group]
                assert got == model.added[start : start + count], f"step {step} {op!r}"
                model.delivered[group] += len(got)
                model.pending[group] += got
            elif kind == "ack":
                _, group, index, n = op
                pending = model.pending[group]
                if pending:
                    index %= len(pending)
                    acked = pending[index : index + n]
                    assert await redis.xack(stream, group, *acked) == len(acked)
                    del pending[index : index + n]
            else:
                cap = ""
                if op[1] is not None and model.added:
                    cap = model.added[op[1] % len(model.added)]
                trimmed = await scripts.trim(keys=[stream, set_key(stream)], args=[cap])
                assert trimmed >= 0, f"step {step} {op!r}: trim returned {trimmed}"
            await check(redis, stream, model, step, op)
    finally:
        await redis.delete(stream)
        await redis.aclose()


@pytest.mark.seed("E12")
@hsettings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=st.lists(operations, min_size=1, max_size=40))
def test_lag_is_exact_under_adds_reads_acks_and_trims(settings: Settings, ops: list[Op]) -> None:
    # The async `redis` fixture is not reset between examples: each example runs
    # on its own client and its own stream key.
    anyio.run(run, settings.redis_url, settings.key_prefix, ops)


@pytest.mark.seed("E12")
def test_lag_is_exact_when_the_slow_groups_last_delivered_entry_is_trimmed(
    settings: Settings,
) -> None:
    """trim.lua removes up to and including the slowest last-delivered-id, so the
    group's last-delivered-id falls before the first entry (research 1.1 R3 / #1952)."""
    ops: list[Op] = [
        ("add", 4),
        ("read", "fast", "c1", 4),
        ("ack", "fast", 0, 3),
        ("ack", "fast", 0, 3),
        ("read", "slow", "c1", 2),
        ("ack", "slow", 0, 2),
        ("trim", None),
        ("add", 2),
        ("read", "slow", "c2", 3),
        ("ack", "slow", 0, 3),
        ("trim", None),
        ("read", "fast", "c2", 2),
        ("read", "slow", "c2", 2),
        ("ack", "fast", 0, 2),
        ("ack", "slow", 0, 2),
        ("trim", None),
        ("add", 1),
    ]
    anyio.run(run, settings.redis_url, settings.key_prefix, ops)


def _nil_lag_expected(flavour: str, version: str) -> bool:
    """Versions the research (redis-streams.md 1.2/1.3) shows give nil in scenario D:
    Redis 7.0-8.x (old and new lag logic), Valkey 7.2-9.0."""
    major, minor = (int(p) for p in version.split(".")[:2])
    if flavour == "valkey":
        return (7, 2) <= (major, minor) <= (9, 0)
    return 7 <= major <= 8


@pytest.mark.seed("E12")
async def test_xdel_of_an_undelivered_entry_makes_lag_nil(
    redis: Any, scripts: Scripts, keyspace: Keyspace, server_version: str
) -> None:
    """Why the runtime never XDELs (research 1.3 scenario D): the group's lag becomes
    nil, so lag alone could never prove the shard drained."""
    stream = keyspace.stream(shard())
    assert await scripts.shard_create(keys=[stream, set_key(stream)], args=["sealed", "g"]) == 1
    ids = [text(await redis.xadd(stream, {"n": str(i)})) for i in range(3)]
    assert (await groups(redis, stream))["g"]["lag"] == 3

    assert await redis.xdel(stream, ids[1]) == 1

    lag = (await groups(redis, stream))["g"]["lag"]
    info = await redis.info("server")
    flavour = "valkey" if "valkey_version" in info else "redis"
    if lag is not None and not _nil_lag_expected(flavour, server_version):
        pytest.skip(
            f"{flavour} {server_version} reports lag {lag} after XDEL of an undelivered "
            "entry (research only covers Redis 7.0-8.x and Valkey 7.2-9.0 giving nil)"
        )
    assert lag is None, f"{flavour} {server_version}: expected nil lag, got {lag}"
    # The true lag is 2; the same history with trim.lua instead of XDEL stays exact.
    assert len(await redis.xrange(stream)) == 2

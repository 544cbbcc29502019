"""A group that is gone for good can be unsubscribed, so it stops holding back scale-ins."""

from __future__ import annotations

import uuid

import pytest

from streamworks import App, Record
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.control import UnsubscribeRequest
from streamworks.testing import TestRuntime
from tests.support import wait_for


def group_app(name: str) -> App:
    app = App(name)
    app.stream("events", shards=3)

    @app.handler("events")
    async def handle(value: dict[str, int]) -> None:
        return None

    return app


@pytest.mark.seed("E11")
async def test_unsubscribing_a_departed_group_lets_the_scale_in_complete(
    streamworks_redis_url: str,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    common = {"redis_url": streamworks_redis_url, "key_prefix": prefix}
    stays, leaves = group_app("stays"), group_app("leaves")
    async with (
        TestRuntime(leaves, workers=1, attach=False, **common) as gone,
        TestRuntime(stays, workers=1, **common) as rt,
    ):
        assert rt.service is not None
        request = UnsubscribeRequest(group="leaves", stream="events", confirm=True)
        with pytest.raises(CoordinatorError) as refused:
            await rt.service.unsubscribe(request)  # it still has a live member
        assert refused.value.code == "IN_USE"
        await gone.stop_worker(0)
        await stays.publish_many("events", [Record({"n": i}, key=str(i)) for i in range(60)])
        await rt.scale("events", 1, wait=False)

        async def blocked() -> bool:
            info = await rt.service.stream_info("events")  # type: ignore[union-attr]
            reasons = " ".join((info.migration or {}).get("blocked", {}).values())
            return "group leaves" in reasons

        await wait_for(blocked, timeout=15, message="the departed group to block the drain")
        await rt.service.unsubscribe(request)

        async def done() -> bool:
            info = await rt.service.stream_info("events")  # type: ignore[union-attr]
            return not any(s.state == "DRAINING" for s in info.shards)

        await wait_for(done, timeout=15, message="the migration to complete")
        assert "leaves" not in await rt.service.store.subscribed_groups("events")
        for key in await rt.shard_keys("events"):
            names = {g["name"] for g in await rt.redis.xinfo_groups(key)}
            assert names == {b"stays"}

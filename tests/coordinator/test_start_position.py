"""``app.stream(name, start=...)``: where a group starts on a stream that already has
entries when it first subscribes — ``earliest`` (every retained entry) or ``latest``
(only entries published after it joined). Only the first subscription uses it: a
member that rejoins, or shards a scale-out adds, never skip an entry."""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError

from streamworks import App
from streamworks.app import StartPosition
from streamworks.protocol.control import HeartbeatRequest
from streamworks.testing import TestRuntime


def group_app(name: str, start: StartPosition) -> tuple[App, list[int]]:
    app = App(name)
    app.stream("events", shards=2, start=start)
    handled: list[int] = []

    @app.handler("events", ordering="none")
    async def handle(value: dict[str, int]) -> None:
        handled.append(value["n"])

    return app, handled


async def publish(app: App, numbers: range) -> None:
    for n in numbers:
        await app.publish("events", {"n": n}, key=f"k{n}")


@pytest.mark.parametrize(("start", "first_seen"), [("latest", 10), ("earliest", 0)])
async def test_a_new_group_starts_where_its_stream_declaration_says(
    streamworks_redis_url: str, start: StartPosition, first_seen: int
) -> None:
    common = {"redis_url": streamworks_redis_url, "key_prefix": f"t{uuid.uuid4().hex[:10]}"}
    producer, produced = group_app("producer", "earliest")
    async with TestRuntime(producer, workers=1, **common) as first:
        await publish(producer, range(10))  # entries that exist before "late" joins
        await first.wait_idle()
        late, handled = group_app("late", start)
        async with TestRuntime(late, workers=1, attach=False, **common) as rt:
            assert rt.service is not None
            # Joined (wait_assigned on entry): its consumer groups exist, and their lag
            # is exact at once, so the runtime can tell it is idle.
            await rt.wait_idle()
            await publish(producer, range(10, 15))
            await rt.wait_idle()
            assert sorted(handled) == list(range(first_seen, 15))

            # A member that rejoins continues where the group stopped: the start
            # position applied to the group's first subscription only.
            await rt.stop_worker(0)
            await publish(producer, range(15, 20))
            await rt.add_worker()
            await rt.wait_idle()
            # A scale-out creates the new shards with the group at their beginning.
            await rt.scale("events", 3)
            await publish(producer, range(20, 40))
            await rt.wait_idle()
            await first.wait_idle()
        assert sorted(handled) == list(range(first_seen, 40))
        assert sorted(produced) == list(range(40))


async def test_subscription_starts_are_validated_strictly() -> None:
    join = {"memberId": "m1", "memberEpoch": 0, "subscriptions": ["events"]}
    request = HeartbeatRequest.model_validate({**join, "subscriptionStarts": {"events": "latest"}})
    assert request.subscription_starts == {"events": "latest"}
    assert HeartbeatRequest.model_validate(join).subscription_starts is None
    for bad in (
        {"events": "middle"},  # not a start position
        {"events": 0},
        {"other": "latest"},  # a stream the member does not subscribe to
    ):
        with pytest.raises(ValidationError):
            HeartbeatRequest.model_validate({**join, "subscriptionStarts": bad})
    with pytest.raises(ValidationError):  # starts without subscriptions
        HeartbeatRequest.model_validate(
            {"memberId": "m1", "memberEpoch": 3, "subscriptionStarts": {"events": "latest"}}
        )

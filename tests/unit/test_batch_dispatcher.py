"""BatchDispatcher: batches take lanes' fronts in order, one batch per lane at a time;
failed items come back at their due time ahead of their lane, released ones too."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import anyio

from streamworks.batch import Batch
from streamworks.clock import Clock
from streamworks.runtime.batch_dispatcher import RELEASED, BatchDispatcher, ItemResult
from streamworks.runtime.message import Message
from tests.support import wait_for


def _message(n: int, key: str) -> Message:
    return Message(f"1-{n}", "events", "events/0@0", b"{}", key=key)


async def test_lanes_are_batched_in_order_and_a_failed_item_holds_its_lane_back() -> None:
    clock = Clock()
    batches: list[list[str]] = []
    failed_once: set[str] = set()

    async def process(batch: list[Message]) -> Sequence[ItemResult]:
        batches.append([m.id for m in batch])
        out: list[ItemResult] = []
        stopped: set[str | None] = set()
        for m in batch:
            if m.key in stopped:
                out.append(RELEASED)
            elif m.id == "1-1" and m.id not in failed_once:
                failed_once.add(m.id)
                out.append(clock.monotonic() + 0.05)  # retried in 50 ms
                stopped.add(m.key)
            else:
                out.append(None)
        return out

    dropped: list[Message] = []
    dispatcher = BatchDispatcher(
        "key", Batch(max_size=3, max_wait=timedelta(0)), 1, process, dropped.append, clock
    )
    # a: 0 1 2 3   b: 4 5
    messages = [_message(n, "a") for n in range(4)] + [_message(n, "b") for n in (4, 5)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(dispatcher.run)
        dispatcher.submit(messages)
        with anyio.fail_after(5):
            await wait_for(lambda: sum(len(b) for b in batches) >= 8)
        tg.cancel_scope.cancel()
    # The first batch: a's first three (consecutive, in order). 1 fails: 2 is released,
    # 0 acked. Then b's two and a's 3 cannot go (a's head, 1, waits 50 ms)...
    assert batches[0] == ["1-0", "1-1", "1-2"]
    assert batches[1] == ["1-4", "1-5"]
    # ... and 1 comes back first, then 2 and 3 behind it.
    assert batches[2] == ["1-1", "1-2", "1-3"]
    assert dropped == []
    assert dispatcher.statistics.sizes.count == 3

"""Batch handlers: ``@app.handler("events", batch=Batch(max_size=500, max_wait=...))``.

A batch handler receives a list of typed payloads and one context. A batch starts when
``max_size`` messages are ready, or ``max_wait`` after the first one became ready,
whichever comes first. Every item is acked after the handler returns; the handler can
fail single items (each retried or dead-lettered alone, under the handler's retry
policy) or raise to fail the whole batch.

Per-key order holds across batches and failures: a batch may hold several messages of
one ordering lane (a key, or a shard in ``ordering="shard"``), in stream order, and
:func:`settle_batch` decides what each item's outcome is so that nothing of a lane is
acked past one of its items that failed. Pure: the runtime applies the outcomes.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from streamworks.exceptions import ConfigurationError

__all__ = ("MAX_BATCH_SIZE", "MAX_BATCH_WAIT", "Batch", "ItemOutcome", "settle_batch")

#: The largest batch (the largest read batch too).
MAX_BATCH_SIZE = 10_000
#: The longest a ready message waits for its batch to fill. Messages wait under the
#: member's lease; longer would only hold them from the handler.
MAX_BATCH_WAIT = timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class Batch:
    """How a batch handler's batches are formed.

    Attributes:
        max_size: most messages in one batch.
        max_wait: longest time the first ready message waits for more (0: a batch is
            whatever is ready when the handler is free).

    Raises:
        ConfigurationError: ``max_size`` outside ``1..MAX_BATCH_SIZE`` or ``max_wait``
            outside ``0..MAX_BATCH_WAIT``.
    """

    max_size: int = 100
    max_wait: timedelta = timedelta(milliseconds=50)

    def __post_init__(self) -> None:
        size = self.max_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH_SIZE:
            raise ConfigurationError(
                f"Batch(max_size=...) must be an int in 1..{MAX_BATCH_SIZE}, not {size!r}"
            )
        wait = self.max_wait
        if not isinstance(wait, timedelta) or not timedelta(0) <= wait <= MAX_BATCH_WAIT:
            raise ConfigurationError(
                f"Batch(max_wait=...) must be a timedelta in 0..{MAX_BATCH_WAIT}, not {wait!r}"
            )

    def full(self, ready: int) -> bool:
        """Whether ``ready`` messages make a batch at once."""
        return ready >= self.max_size

    def starts_at(self, first_ready: float) -> float:
        """When a batch whose first message became ready at ``first_ready`` (seconds,
        any clock) starts, if it does not fill up before."""
        return first_ready + self.max_wait.total_seconds()


class ItemOutcome(enum.Enum):
    """What becomes of one item of a batch after the handler ran."""

    ACK = "ack"  # done: acked with the batch
    FAILED = "failed"  # an attempt that failed: retried or dead-lettered by its policy
    RELEASED = "released"  # not settled: after an earlier failure of its lane, it is run
    # again after that one, and the run that was not its turn is not counted as an attempt


def settle_batch(
    lanes: Sequence[Hashable | None],
    failed: Collection[int] = (),
    *,
    batch_failed: bool = False,
) -> list[ItemOutcome]:
    """The outcome of each item of a batch.

    Args:
        lanes: each item's ordering lane, in batch order (the stream order within a
            lane); None for an item that keeps no order (``ordering="none"``).
        failed: indexes of the items the handler failed.
        batch_failed: the handler raised: every item failed an attempt.

    Returns:
        One outcome per item: an item before its lane's first failure is acked, a failed
        item is FAILED, and an item after its lane's first failure that the handler did
        not fail is RELEASED, so that the lane resumes at the failed item and no later
        item of it is acked before it (per-key order across batches).
    """
    n = len(lanes)
    for i in failed:
        if not 0 <= i < n:
            raise IndexError(f"failed item {i} is not in a batch of {n}")
    if batch_failed:
        return [ItemOutcome.FAILED] * n
    failed_set = set(failed)
    stopped: set[Hashable] = set()
    out: list[ItemOutcome] = []
    for i, lane in enumerate(lanes):
        if i in failed_set:
            out.append(ItemOutcome.FAILED)
            if lane is not None:
                stopped.add(lane)
        elif lane is not None and lane in stopped:
            out.append(ItemOutcome.RELEASED)
        else:
            out.append(ItemOutcome.ACK)
    return out

"""The handler hot path (``HandlerRuntime._process_simple``, with ``FirstSteps`` running
a handler's first step in place) against the general path (``HandlerRuntime.process``):
the same messages, down both roads, end the same way — the same attempts per message,
the same acks (nothing pending), the same dead letters with their reasons and attempt
counts, the same statistics and the same worker metrics.

The hot path serves an ``async def`` handler with no timeout, no idempotency key, no
``Context`` and no middleware. The same handler with a timeout far above its runs, or
behind a middleware that only passes through, takes the general path; neither changes
what a run does. Every road is checked to be the one meant, so the comparison cannot
silently compare a road with itself."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from streamworks import App, Context, Middleware, Retry, RetryPolicy, Skip
from streamworks.middleware import HandleNext
from streamworks.testing import TestRuntime


class Job(BaseModel):
    id: str
    kind: str


#: (kind, how many of it): every way a run can end, with and without suspending
#: before it ends (a handler that suspends leaves FirstSteps for a task of its own).
KINDS: dict[str, int] = {
    "ok": 6,
    "ok_after_suspending": 4,
    "suspend_twice": 2,
    "fail_once": 3,
    "fail_once_after_suspending": 2,
    "always_fail": 2,
    "always_fail_after_suspending": 2,
    "skip": 2,
    "skip_after_suspending": 1,
    "retry_signal_once": 2,
    "retry_signal_after_suspending": 1,
}
POISON = 3  # payloads that do not validate as a Job: dead-lettered before any run


class PassThrough(Middleware):
    async def handle(self, ctx: Context, call_next: HandleNext) -> None:
        await call_next(ctx)


def _app(road: str, attempts: dict[str, list[int]]) -> App:
    app = App("g", middleware=[PassThrough()] if road == "middleware" else [])
    app.stream("jobs", shards=2)
    options: dict[str, Any] = {"timeout": 600.0} if road == "timeout" else {}

    @app.handler("jobs", retry=RetryPolicy(max_attempts=3, backoff=0.001), **options)
    async def handle(job: Job) -> None:
        runs = attempts[job.id]
        runs.append(len(runs) + 1)
        first = len(runs) == 1
        if job.kind.endswith("after_suspending") or job.kind == "suspend_twice":
            await anyio.sleep(0.001)  # a real suspension
            if job.kind == "suspend_twice":
                await anyio.sleep(0.001)  # a real suspension
        if job.kind.startswith("fail_once") and first:
            raise RuntimeError(f"{job.id} failed once")
        if job.kind.startswith("always_fail"):
            raise RuntimeError(f"{job.id} fails")
        if job.kind.startswith("skip"):
            raise Skip()
        if job.kind.startswith("retry_signal") and first:
            raise Retry(delay=0.001)

    return app


#: Metric samples whose values depend on time or on the order of events, not on the
#: outcome: durations' sums and buckets, batch sizes, publish timings, lag and gauges
#: of the moment.
_TIMING = re.compile(r"_seconds_(bucket|sum)|read_batch_size|publish_seconds|_lag\{|in_flight")


def _outcome_metrics(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or "jobs" not in line or _TIMING.search(line):
            continue
        name, value = line.rsplit(" ", 1)
        samples[re.sub(r'handler="[^"]*"', 'handler="h"', name)] = float(value)
    return samples


async def _run(road: str, streamworks_runtime: Callable[..., TestRuntime]) -> dict[str, Any]:
    attempts: dict[str, list[int]] = defaultdict(list)
    app = _app(road, attempts)
    async with streamworks_runtime(app) as rt:
        [worker] = rt.workers
        process = worker.handlers["jobs"].dispatcher._process
        assert process.__name__ == ("_process_simple" if road == "hot" else "process"), road
        for kind, count in KINDS.items():
            for i in range(count):
                await app.publish("jobs", Job(id=f"{kind}-{i}", kind=kind), key=f"{kind}-{i}")
        for i in range(POISON):
            await app.publish("jobs", {"id": f"poison-{i}"}, key=f"poison-{i}")
        await rt.wait_idle()
        pending = 0
        for key in await rt.shard_keys("jobs"):
            pending += (await worker.redis.xpending(key, "g"))["pending"]
        dead = sorted(
            (d.payload, d.key, d.reason, d.attempts) for d in await rt.dead_letters("jobs")
        )
        return {
            "attempts": dict(attempts),
            "handled": rt.handled("jobs"),
            "statistics": rt.statistics("jobs"),
            "pending": pending,
            "dead_letters": dead,
            "metrics": _outcome_metrics(await rt.worker_metrics(0)),
        }


@pytest.mark.parametrize("general", ["timeout", "middleware"])
async def test_the_hot_path_ends_every_message_as_the_general_path_does(
    general: str, streamworks_runtime: Callable[..., TestRuntime]
) -> None:
    hot = await _run("hot", streamworks_runtime)
    other = await _run(general, streamworks_runtime)

    # What the scenario must produce at all (so that equal cannot mean equally empty).
    total = sum(KINDS.values())
    assert len(hot["attempts"]) == total
    assert hot["pending"] == 0
    assert hot["statistics"]["poison"] == POISON
    assert hot["statistics"]["dead_lettered"] == POISON + 4  # the always_fail ones
    assert hot["statistics"]["skipped"] == 3
    assert hot["attempts"]["always_fail-0"] == [1, 2, 3]
    assert hot["attempts"]["fail_once_after_suspending-1"] == [1, 2]

    for part in ("attempts", "handled", "statistics", "pending", "dead_letters", "metrics"):
        assert hot[part] == other[part], part

"""Worker metrics in one process: one registry per worker, counters read at scrape
time, the histograms filled on the message path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from streamworks import App, Record, RetryPolicy, Skip
from streamworks.testing import TestRuntime


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples that carry ``labels`` (0 when there is none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples(text).items() if n == name and wanted <= ls)


async def test_two_workers_in_one_process_have_their_own_series(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("m")
    app.stream("orders", shards=2)

    @app.handler("orders", retry=RetryPolicy(max_attempts=2, backoff=0.01, jitter=False))
    async def handle(order: dict[str, Any]) -> None:
        if order["kind"] == "skip":
            raise Skip()
        if order["kind"] == "bad":
            raise ValueError("always")

    async with streamworks_runtime(app, workers=2) as rt:
        # Shard 0 and shard 1 each get a keyed share (jump hash over 2 shards).
        records = [Record({"kind": "ok"}, key=f"k{i}") for i in range(40)]
        records += [Record({"kind": "skip"}, key="k1"), Record({"kind": "bad"}, key="k2")]
        await app.publish_many("orders", records)
        await rt.wait_idle()
        texts = [await rt.worker_metrics(i) for i in range(2)]
        labels = {"group": "m", "stream": "orders", "handler": handle.__qualname__}
        handled = [value(t, "streamworks_messages_handled_total", **labels) for t in texts]
        # handled counts every acked run, the skipped one too (skipped is a subset).
        assert sum(handled) == 41 and all(n > 0 for n in handled), handled
        assert sum(value(t, "streamworks_messages_skipped_total", **labels) for t in texts) == 1
        assert sum(value(t, "streamworks_messages_failed_total", **labels) for t in texts) == 2
        assert sum(value(t, "streamworks_messages_retried_total", **labels) for t in texts) == 1
        dead = sum(value(t, "streamworks_messages_dead_lettered_total", **labels) for t in texts)
        assert dead == 1
        runs = sum(value(t, "streamworks_handler_duration_seconds_count", **labels) for t in texts)
        assert runs == 40 + 1 + 2  # every run, whatever its outcome
        for text in texts:
            assert value(text, "streamworks_shards_owned", group="m") == 1
            assert value(text, "streamworks_lease_remaining_seconds", group="m") > 0
            assert value(text, "streamworks_messages_in_flight", **labels) == 0
            (shard,) = {
                dict(ls)["shard"] for (n, ls) in samples(text) if n == "streamworks_shard_pending"
            }
            assert value(text, "streamworks_shard_pending", shard=shard) == 0
            assert value(text, "streamworks_shard_lag", shard=shard) == 0
            assert value(text, "streamworks_read_batch_size_count", group="m") >= 1
            assert value(text, "streamworks_ack_flush_seconds_count", group="m") >= 1
            assert value(text, "process_cpu_seconds_total") > 0
        # The runtime's producer published: one publish_many call of 42 messages.
        assert value(texts[0], "streamworks_publish_total", stream="orders") == 42
        assert value(texts[0], "streamworks_publish_seconds_count", stream="orders") == 1


async def test_pending_counts_entries_not_acked_yet(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """A message whose handler is still running is pending on its shard and in flight."""
    import anyio

    app = App("p")
    app.stream("orders", shards=1)
    started = anyio.Event()
    release = anyio.Event()

    @app.handler("orders")
    async def handle(order: dict[str, Any]) -> None:
        started.set()
        await release.wait()

    async with streamworks_runtime(app, workers=1) as rt:
        await app.publish("orders", {"n": 1})
        with anyio.fail_after(5):
            await started.wait()
        text = await rt.worker_metrics()
        assert value(text, "streamworks_shard_pending", group="p", shard="orders/0@0") == 1
        assert value(text, "streamworks_messages_in_flight", group="p") == 1
        release.set()
        await rt.wait_idle()
        text = await rt.worker_metrics()
        assert value(text, "streamworks_shard_pending", group="p", shard="orders/0@0") == 0
